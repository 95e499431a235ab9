"""Fixtures of the codegen tests (helpers: codegen_helpers.py)."""
from __future__ import annotations

import pytest
from codegen_helpers import host_record


@pytest.fixture
def host_caps(): return host_record
