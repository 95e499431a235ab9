#!/usr/bin/env bash
# One prepared check of the AMD backend on a machine with an AMD GPU and the amdgpu driver (<= 10 minutes; summary last).
#
#   bash bench/amd_check.sh            # from the repo root
#   QUICK=1 bash bench/amd_check.sh    # shorter conformance run, smaller matmuls
#
# Stages (each with its own time limit; a failing stage is reported and the next one still runs):
#   setup        venv at $AMD_VENV (default /tmp/plugrad-amd-venv, reusing system packages), editable core/cpu/amd;
#                needs clang-19 and ld.lld-19 (apt-get install clang-19 lld-19)
#   devices      plugrad-devices must list AMD as available (the reason is printed when it is not: /dev/kfd, groups)
#   amd-tests    tests/amd (the mock and compile tests; they need no GPU)
#   smoke        [1,2,3]*2 and a 1M-element copy round trip with DEV=AMD
#   conformance  DEV=AMD pytest --pyargs plugrad.testing
#   bench        copy bandwidth (host->device, device->host, device->device through SDMA), elementwise GB/s,
#                f32/f16 matmul TFLOPS next to PyTorch-ROCm when torch with a ROCm GPU is importable
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
RESULTS=()
record() { RESULTS+=("$(printf '%-14s %-6s %s' "$1" "$2" "$3")"); }
stage() {  # stage NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s) ==="
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "/tmp/amd_check_$name.log" | tail -n 40
  local rc=${PIPESTATUS[0]}
  local dt=$(( $(date +%s) - t0 ))
  local last=$(grep -iE "passed|failed|error|skipped" "/tmp/amd_check_$name.log" | tail -n 1 | cut -c1-90)
  if [ "$rc" = 0 ]; then record "$name" "ok" "${dt}s ${last}"; elif [ "$rc" = 124 ]; then record "$name" "TIMEOUT" "${dt}s ${last}"; else record "$name" "FAIL($rc)" "${dt}s ${last}"; fi
  return "$rc"
}

AMD_VENV=${AMD_VENV:-/tmp/plugrad-amd-venv}
PYBIN=${PYTHON:-python3}
GPUS=$(grep -h gfx_target_version /sys/devices/virtual/kfd/kfd/topology/nodes/*/properties 2>/dev/null | awk '$2 != 0 {print $2}' | tr '\n' ' ')
setup() {
  command -v clang-19 >/dev/null && command -v ld.lld-19 >/dev/null || { echo "clang-19/ld.lld-19 missing: apt-get install clang-19 lld-19"; return 1; }
  [ -x "$AMD_VENV/bin/python" ] || "$PYBIN" -m venv --system-site-packages "$AMD_VENV" || return 1
  local pip="$AMD_VENV/bin/python -m pip install -q --disable-pip-version-check"
  $pip -e "core[test]" -e plugins/cpu -e plugins/amd || $pip --no-deps --no-build-isolation -e core -e plugins/cpu -e plugins/amd
}
export AMD_VENV PYBIN
stage setup 150 bash -c "$(declare -f setup); setup"
PY="$AMD_VENV/bin/python"
export PLUGRAD_CACHE_DIR=${PLUGRAD_CACHE_DIR:-/tmp/plugrad-amd-cache}
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 4" || echo "")

stage devices 60 bash -c "\"$PY\" -m plugrad.devices --no-smoke | tee /dev/stderr | grep -E '^ +AMD +.*available' | grep -vq UNAVAILABLE"
stage amd-tests 300 "$PY" -m pytest -q -p no:randomly $XDIST tests/amd
stage smoke 60 env DEV=AMD "$PY" -c "
import numpy as np
from plugrad.tensor import Tensor
from plugrad.device import Buffer, Device
from plugrad.dtype import dtypes
d = Device['AMD']; print(d, d.arch)
x = np.random.rand(1 << 20).astype(np.float32)
assert np.array_equal(Buffer('AMD', x.size, dtypes.float32).copyin(x).numpy(), x), 'copy round trip'
print('copy round trip ok')
print((Tensor([1, 2, 3]) * 2).tolist())
"
if [ "${QUICK:-0}" = 1 ]; then CONF_ARGS="-m 'not slow'"; else CONF_ARGS=""; fi
stage conformance 240 bash -c "DEV=AMD \"$PY\" -m pytest -q --tb=short -p no:randomly $CONF_ARGS --pyargs plugrad.testing"

cat > /tmp/amd_bench.py <<'PYEOF'
import os, time
import numpy as np
from plugrad.device import Device
from plugrad.dtype import dtypes
from plugrad.tensor import Tensor
dev = Device["AMD"]
QUICK = os.environ.get("QUICK") == "1"
def row(name, val, unit, note=""): print(f"BENCH {name} {val:.2f} {unit} {note}", flush=True)
def best(fn, n=5):
  fn(); dev.synchronize(); ts = []
  for _ in range(n):
    t = time.perf_counter(); fn(); dev.synchronize(); ts.append(time.perf_counter() - t)
  return min(ts)
try:
  import torch; HAS_TORCH = torch.cuda.is_available() and torch.version.hip is not None
except Exception: HAS_TORCH = False
def torch_time(fn, n=5):
  fn(); torch.cuda.synchronize(); ts = []
  for _ in range(n):
    t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
  return min(ts)
n = 256 << 20
host = np.ones(n, np.uint8); out = np.empty_like(host)
buf = dev.allocator.alloc(n)
row("copy_h2d", n / best(lambda: dev.allocator._copyin(buf, memoryview(host)), 3) / 1e9, "GB/s", "through the 2 MiB staging buffer")
row("copy_d2h", n / best(lambda: dev.allocator._copyout(memoryview(out), buf), 3) / 1e9, "GB/s")
a, b = dev.allocator.alloc(n), dev.allocator.alloc(n)
copy_bw = 2 * n / best(lambda: dev.allocator._copy(b.va_addr, a.va_addr, n)) / 1e9
row("copy_d2d", copy_bw, "GB/s", "SDMA, read+write")
if HAS_TORCH:
  x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
  row("torch_copy_d2d", 2 * n / torch_time(lambda: y.copy_(x)) / 1e9, "GB/s")
N = 1 << (20 if QUICK else 24)
ea, eb = Tensor.ones(N, device="AMD").contiguous().realize(), Tensor.ones(N, device="AMD").contiguous().realize()
row("elementwise_add", 3 * 4 * N / best(lambda: (ea + eb).realize(), 3) / 1e9, "GB/s", "CPU-style kernels run one work-item until GPU codegen lands")
for dt, tdt in ((dtypes.float32, "float32"), (dtypes.float16, "float16")):
  s = 256 if QUICK else 1024
  try:
    A = Tensor.ones(s, s, device="AMD", dtype=dt).contiguous().realize(); B = Tensor.ones(s, s, device="AMD", dtype=dt).contiguous().realize()
    tf = 2 * s ** 3 / best(lambda: (A @ B).realize(), 2) / 1e12
    note = ""
    if HAS_TORCH:
      tA = torch.ones(s, s, dtype=getattr(torch, tdt), device="cuda"); tB = torch.ones_like(tA)
      ttf = 2 * s ** 3 / torch_time(lambda: tA @ tB, 3) / 1e12
      note = f"torch-rocm {ttf:.2f} TFLOPS ratio {tf / ttf:.4f}"
    row(f"matmul_{tdt}_{s}", tf, "TFLOPS", note)
  except Exception as e: print(f"BENCH matmul_{tdt}_{s} nan TFLOPS error: {type(e).__name__}: {str(e)[:120]}")
PYEOF
stage bench 200 bash -c "QUICK=${QUICK:-0} \"$PY\" /tmp/amd_bench.py"

echo
echo "================ AMD check summary: gfx_target_version ${GPUS:-none}, $(( $(date +%s) - START ))s total ================"
for r in "${RESULTS[@]}"; do echo "$r"; done
grep -h "^BENCH" /tmp/amd_check_bench.log 2>/dev/null | awk '{ printf "%-22s %10s %-7s", $2, $3, $4; $1=$2=$3=$4=""; print $0 }'
