# plugrad developer entry points. `make test` works from a fresh machine: it installs
# the apt packages the tests need, builds .venv, installs core and every plugin editable.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PLUGINS := $(wildcard plugins/*/pyproject.toml)
STAMP := $(VENV)/.installed

.PHONY: setup test lint demo bench clean sysdeps

sysdeps:
	@command -v clang >/dev/null 2>&1 || { \
	  echo "installing clang from apt"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang lld >/dev/null; }

$(STAMP): core/pyproject.toml $(PLUGINS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e "core[test]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	@touch $(STAMP)

setup: sysdeps $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest -n 2 -q

demo: setup
	$(PY) -m plugrad.devices
	$(PY) examples/demo.py

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
