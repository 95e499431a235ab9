#!/usr/bin/env bash
# One prepared check of the NV backend on a machine with an NVIDIA GPU (<= 8 minutes; prints a summary table last).
#
#   bash bench/nv_check.sh            # from the repo root
#   QUICK=1 bash bench/nv_check.sh    # skip 8192^3 matmuls and shorten the conformance run
#
# Stages (each with its own time limit; a failing stage is reported and the next one still runs):
#   setup        venv at $NV_VENV (default /tmp/plugrad-nv-venv, reusing system packages), editable core/cpu/nv;
#                NVRTC from the nvidia-cuda-nvrtc wheel (cu13 for r580+ drivers, cu12 otherwise) or, offline, from a
#                CUDA toolkit ($CUDA_HOME, /usr/local/cuda: lib64 goes on LD_LIBRARY_PATH, include gives cuda_fp16.h)
#   devices      plugrad-devices must list NV as available
#   launch-dims  codegen gives NV kernels hardware ids: an elementwise add and a sum get SPECIAL ops and a
#                ProgramSpec.local_size (the engine passes global_size/local_size to every launch); fails when kernels
#                would run as one thread (no gpudims pass), so slow figures below are read for what they are
#   nv-tests     tests/nv (GPU execution tests included: SPECIAL ids, shared memory + barriers, mma.sync f16/bf16)
#   conformance  DEV=NV pytest --pyargs plugrad.testing (xdist across CPU cores)
#   jit+symbolic DEV=NV pytest tests/engine
#   bench        D2D copy GB/s, elementwise GB/s, f32/f16/bf16 matmul TFLOPS at 4096^3 and 8192^3 next to torch (cuBLAS)
#                when torch is importable, LLM decode tok/s when plugrad.apps.llm exists
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
RESULTS=()
record() { RESULTS+=("$(printf '%-14s %-6s %s' "$1" "$2" "$3")"); }
stage() {  # stage NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s) ==="
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "/tmp/nv_check_$name.log" | tail -n 40
  local rc=${PIPESTATUS[0]}
  local dt=$(( $(date +%s) - t0 ))
  local last=$(grep -iE "passed|failed|error|skipped" "/tmp/nv_check_$name.log" | tail -n 1 | cut -c1-90)
  if [ "$rc" = 0 ]; then record "$name" "ok" "${dt}s ${last}"; elif [ "$rc" = 124 ]; then record "$name" "TIMEOUT" "${dt}s ${last}"; else record "$name" "FAIL($rc)" "${dt}s ${last}"; fi
  return "$rc"
}

# ---- setup
NV_VENV=${NV_VENV:-/tmp/plugrad-nv-venv}
PYBIN=${PYTHON:-python3}
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
  if [ -n "$d" ] && [ -d "$d/lib64" ]; then export CUDA_HOME=$d LD_LIBRARY_PATH="$d/lib64:${LD_LIBRARY_PATH:-}" PATH="$d/bin:$PATH"; break; fi
done
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
EXTRA=cu13; [ -n "$DRIVER" ] && [ "${DRIVER%%.*}" -lt 580 ] && EXTRA=cu12
setup() {
  [ -x "$NV_VENV/bin/python" ] || "$PYBIN" -m venv --system-site-packages "$NV_VENV" || return 1
  local pip="$NV_VENV/bin/python -m pip install -q --disable-pip-version-check"
  $pip -e "core[test]" -e plugins/cpu -e "plugins/nv[$EXTRA]" \
    || { echo "online install failed: installing without dependencies (system packages + CUDA toolkit NVRTC)";
         $pip --no-deps --no-build-isolation -e core -e plugins/cpu -e plugins/nv; } || return 1
  "$NV_VENV/bin/python" -c "import plugrad_nv.compiler as c; print('NVRTC', c.nvrtc_version(), 'headers', c.cuda_include_dirs())"
}
export NV_VENV PYBIN EXTRA
stage setup 150 bash -c "$(declare -f setup); setup"
PY="$NV_VENV/bin/python"
export PLUGRAD_CACHE_DIR=${PLUGRAD_CACHE_DIR:-/tmp/plugrad-nv-cache}
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")

stage devices 60 bash -c "\"$PY\" -m plugrad.devices | tee /dev/stderr | grep -E '^ +NV +.*available' | grep -vq UNAVAILABLE"
cat > /tmp/nv_launch.py <<'PYEOF'
from plugrad.codegen import get_program
from plugrad.device import Device
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops
ok = True
for name, t in (("add", Tensor.ones(1 << 20, device="NV").contiguous() + 1), ("sum", Tensor.ones(4096, 1024, device="NV").contiguous().sum(1))):
  spec = get_program(t.schedule()[-1].ast, Device["NV"].renderer)
  ids = sorted({u.arg for u in spec.uops if u.op is Ops.SPECIAL})
  print(f"{name}: {spec.name} global_size={spec.global_size} local_size={spec.local_size} ids={ids}")
  ok &= bool(ids) and spec.local_size is not None
raise SystemExit(0 if ok else 1)
PYEOF
stage launch-dims 60 "$PY" /tmp/nv_launch.py
stage nv-tests 120 "$PY" -m pytest -q -p no:randomly tests/nv
if [ "${QUICK:-0}" = 1 ]; then CONF_ARGS="-m 'not slow'"; else CONF_ARGS=""; fi
stage conformance 240 bash -c "DEV=NV \"$PY\" -m pytest -q --tb=short -p no:randomly $XDIST $CONF_ARGS --pyargs plugrad.testing"
stage jit+symbolic 60 bash -c "DEV=NV \"$PY\" -m pytest -q --tb=short -p no:randomly tests/engine"

# ---- benchmarks (one Python run; prints rows 'BENCH name value unit note')
cat > /tmp/nv_bench.py <<'PYEOF'
import os, sys, time
import numpy as np
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
dev = Device["NV"]
QUICK = os.environ.get("QUICK") == "1"
def row(name, val, unit, note=""): print(f"BENCH {name} {val:.2f} {unit} {note}", flush=True)
def best(fn, n=5):
  fn(); dev.synchronize()
  ts = []
  for _ in range(n):
    t = time.perf_counter(); fn(); dev.synchronize(); ts.append(time.perf_counter() - t)
  return min(ts)
try: import torch; HAS_TORCH = torch.cuda.is_available()
except Exception: HAS_TORCH = False
def torch_time(fn, n=5):
  fn(); torch.cuda.synchronize(); ts = []
  for _ in range(n):
    t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
  return min(ts)
# device-to-device copy bandwidth through the copy queue
n = 1 << 30
a, b = dev.allocator.alloc(n), dev.allocator.alloc(n)
copy_bw = 2 * n / best(lambda: dev.allocator._copy(b.va_addr, a.va_addr, n)) / 1e9
row("copy_d2d", copy_bw, "GB/s", "read+write")
if HAS_TORCH:
  x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
  row("torch_copy", 2 * n / torch_time(lambda: y.copy_(x)) / 1e9, "GB/s")
# elementwise a + b, float32, 64M elements
N = 1 << 26
ea, eb = Tensor.ones(N, device="NV").contiguous().realize(), Tensor.ones(N, device="NV").contiguous().realize()
ew = 3 * 4 * N / best(lambda: (ea + eb).realize()) / 1e9
row("elementwise_add", ew, "GB/s", f"{ew / copy_bw:.2f}x copy (target >= 0.7)")
# matmuls
for dt, tdt in ((dtypes.float32, "float32"), (dtypes.float16, "float16"), (dtypes.bfloat16, "bfloat16")):
  for s in ((4096,) if QUICK else (4096, 8192)):
    try:
      A = Tensor.ones(s, s, device="NV", dtype=dt).contiguous().realize(); B = Tensor.ones(s, s, device="NV", dtype=dt).contiguous().realize()
      tf = 2 * s ** 3 / best(lambda: (A @ B).realize(), n=2 if s > 4096 else 3) / 1e12
      note = ""
      if HAS_TORCH:
        tA = torch.ones(s, s, dtype=getattr(torch, tdt), device="cuda"); tB = torch.ones_like(tA)
        ttf = 2 * s ** 3 / torch_time(lambda: tA @ tB, n=3) / 1e12
        note = f"cuBLAS {ttf:.1f} TFLOPS ratio {tf / ttf:.2f}"
      row(f"matmul_{tdt}_{s}", tf, "TFLOPS", note)
    except Exception as e: print(f"BENCH matmul_{tdt}_{s} nan TFLOPS error: {type(e).__name__}: {str(e)[:120]}")
try:
  import plugrad.apps.llm  # noqa: F401
  print("BENCH llm_decode nan tok/s plugrad.apps.llm present: add its decode benchmark here")
except ImportError: print("BENCH llm_decode nan tok/s n/a: plugrad.apps.llm does not exist yet")
PYEOF
stage bench 200 bash -c "QUICK=${QUICK:-0} \"$PY\" /tmp/nv_bench.py"

# ---- summary (last)
echo
echo "================ NV check summary: ${GPU:-unknown GPU}, driver ${DRIVER:-?}, extra $EXTRA, $(( $(date +%s) - START ))s total ================"
for r in "${RESULTS[@]}"; do echo "$r"; done
grep -h "^BENCH" /tmp/nv_check_bench.log 2>/dev/null | awk '{ printf "%-22s %10s %-7s", $2, $3, $4; $1=$2=$3=$4=""; print $0 }'
