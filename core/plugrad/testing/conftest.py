"""pytest setup for the conformance suite when it runs from an installed plugrad (`DEV=X pytest --pyargs plugrad.testing`).

Registers the suite's markers (so `--strict-markers` works without the repo's pytest.ini), names the device under test
in the report header, and offers a `device` fixture. Tests use the default device: set it with DEV.
"""
from __future__ import annotations

import pytest

from plugrad.device import Device


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "slow: slower tests (skip with -m 'not slow', e.g. on the PYTHON reference device)")


def pytest_report_header(config: pytest.Config) -> str:
  try: return f"plugrad conformance suite on device {Device.DEFAULT} (set DEV to choose another)"
  except Exception as e: return f"plugrad conformance suite: no usable device ({type(e).__name__}: {str(e).splitlines()[0]})"


@pytest.fixture
def device() -> str:
  """The canonical name of the device under test."""
  return Device.DEFAULT
