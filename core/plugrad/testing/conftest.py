"""pytest setup for the conformance suite when it runs from an installed plugrad (`DEV=X pytest --pyargs plugrad.testing`).

Registers the suite's markers (so `--strict-markers` works without the repo's pytest.ini), names the device under test
(in the summary at the end; in the header too where pytest loads this file first), and offers a `device` fixture.
Tests use the default device: set it with DEV. A device that can't be opened,
or a missing hypothesis (the [conformance] extra installs it), stops the run with one line before any test.
"""
from __future__ import annotations

import importlib.util

import pytest

from plugrad.device import Device, DeviceError
from plugrad.devices import one_line


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "slow: slower tests (skip with -m 'not slow', e.g. on the PYTHON reference device)")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
  if importlib.util.find_spec("hypothesis") is None:
    raise pytest.UsageError("the plugrad conformance suite needs hypothesis: pip install 'plugrad[conformance]'")
  try: Device[Device.DEFAULT]
  except (DeviceError, ValueError) as e: raise pytest.UsageError(f"plugrad conformance suite: no device to test: {one_line(e)}") from None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
  """Name the device under test at the end of the run (with --pyargs this conftest loads after the header is printed)."""
  try: terminalreporter.write_line(f"plugrad conformance suite on device {Device.DEFAULT}")
  except Exception: pass  # no device: the collection hook already stopped the run with the reason


def pytest_report_header(config: pytest.Config) -> str:
  try: return f"plugrad conformance suite on device {Device.DEFAULT} (set DEV to choose another)"
  except Exception as e: return f"plugrad conformance suite: no usable device ({type(e).__name__}: {str(e).splitlines()[0]})"


@pytest.fixture
def device() -> str:
  """The canonical name of the device under test."""
  return Device.DEFAULT
