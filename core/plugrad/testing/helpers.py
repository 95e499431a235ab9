"""Helpers for conformance tests: run an op in plugrad and in numpy on the same inputs and compare; the suite's rules
for what a test may skip (`oracle`, `require_dtype`)."""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from plugrad.dtype import DType, dtypes
from plugrad.tensor import Tensor

# tolerances per dtype: (atol, rtol)
TOLERANCE: dict[DType, tuple[float, float]] = {
  dtypes.float64: (1e-9, 1e-9), dtypes.float32: (1e-5, 1e-5), dtypes.float16: (1e-2, 1e-2), dtypes.bfloat16: (5e-2, 5e-2),
  dtypes.fp8e4m3: (1e-1, 1e-1), dtypes.fp8e5m2: (2e-1, 2e-1)}


def rand_np(shape: Sequence[int], dtype: DType = dtypes.float32, low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
  """Deterministic random input of `shape`: uniform floats in [low, high), ints in [low, high], bools 50/50."""
  rng = np.random.default_rng(seed)
  if dtype == dtypes.bool: return rng.random(shape) < 0.5
  if dtypes.is_int(dtype): return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype.np)
  return rng.uniform(low, high, size=shape).astype(dtype.np if dtype.np is not None else np.float32)


def assert_close(got: np.ndarray, want: np.ndarray, atol: float | None = None, rtol: float | None = None, dtype: DType | None = None,
                 check_dtype: bool = True, msg: str = "") -> None:
  """Shapes equal, dtypes equal (unless check_dtype=False), values equal within the dtype's tolerance (exact for ints/bools)."""
  want = np.asarray(want)
  assert got.shape == want.shape, f"{msg} shape {got.shape} != numpy's {want.shape}"
  if check_dtype: assert got.dtype == want.dtype, f"{msg} dtype {got.dtype} != numpy's {want.dtype}"
  if got.dtype.kind in "biu" and want.dtype.kind in "biu" and atol is None: np.testing.assert_array_equal(got, want, err_msg=msg); return
  d = dtype or (dtypes.from_np(want.dtype) if want.dtype.kind == "f" else dtypes.float32)
  a, r = TOLERANCE.get(d, (1e-5, 1e-5))
  np.testing.assert_allclose(got, want, atol=a if atol is None else atol, rtol=r if rtol is None else rtol, equal_nan=True, err_msg=msg)


def check_op(shapes: Sequence[Sequence[int]], fn: Callable[..., Any], np_fn: Callable[..., Any] | None = None, dtype: DType = dtypes.float32,
             low: float = -2.0, high: float = 2.0, atol: float | None = None, rtol: float | None = None, check_dtype: bool = True,
             inputs: Sequence[np.ndarray] | None = None) -> None:
  """Apply `fn` to Tensors and `np_fn` (default: `fn`) to numpy arrays made from the same random inputs; compare."""
  arrs = list(inputs) if inputs is not None else [rand_np(s, dtype, low, high, seed=i) for i, s in enumerate(shapes)]
  want = (np_fn or fn)(*arrs)
  got = fn(*[Tensor(a) for a in arrs])
  assert_close(got.numpy(), want, atol, rtol, dtype, check_dtype, msg=getattr(fn, "__name__", ""))


def oracle(module: str, checks: str) -> ModuleType:
  """The reference library `module` (ml_dtypes, einops: the [conformance] extra installs them). Missing, the test fails
  naming the extra: the suite never skips a check for want of its oracle, so a green run means the checks ran."""
  try: return importlib.import_module(module)
  except ImportError:
    pytest.fail(f"{module} is the oracle of {checks}, which the device under test claims: pip install 'plugrad[conformance]'", pytrace=False)


def require_dtype(dt: DType) -> None:
  """Skip the test when the device under test doesn't claim `dt`: its renderer raises NotImplementedError for it (the
  contract of docs/backends.md). Anything else (a compile error, a wrong value) is the test's failure, not a skip."""
  try: (Tensor([1.0, 2.0]).cast(dt) * Tensor([3.0, 0.5]).cast(dt)).cast(dtypes.float32).realize()
  except NotImplementedError as e: pytest.skip(f"the device doesn't render {dt.name}: {str(e).splitlines()[0]}")
