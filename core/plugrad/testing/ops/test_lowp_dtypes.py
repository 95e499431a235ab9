"""Conformance of the low-precision floats bfloat16, fp8e4m3 (OCP E4M3 "fn") and fp8e5m2 (OCP E5M2) on any device.

Oracles: `ml_dtypes` (the formats' reference implementation, in the [conformance] extra: without it these tests fail,
they don't skip) and the OCP 8-bit floating point specification's values written out by hand for the specials. A test
skips only where the device's renderer says it has no such type (NotImplementedError, `helpers.require_dtype`). Semantics checked:
- float -> low precision rounds to nearest, ties to even (a backend that truncates bf16 or fp8 fails on the midpoints
  and just above them); subnormals; signed zero; NaN stays NaN; inf stays inf for bf16 and E5M2; E4M3 has no inf and
  saturates a magnitude past its largest finite value 448 (inf too) to +-448, as CUDA's __NV_SATFINITE conversion does;
  E5M2 rounds from 61440 (halfway to the absent next step) up to inf.
- low precision -> float32 is exact for every bit pattern; -> int truncates toward zero; bf16 <-> float16 through float.
- arithmetic is computed in float32 and rounded once to the type (exact for +, -, * of these formats).
- reductions and matmuls accumulate in float32 and round the result once (sums that bf16/fp8 accumulators get wrong).
"""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.dtype import DType, dtypes
from plugrad.tensor import Tensor
from plugrad.testing.helpers import oracle as oracle_module
from plugrad.testing.helpers import require_dtype

LOWP = [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]
IDS = ["bf16", "e4m3", "e5m2"]
BITS = {dtypes.bfloat16: (np.uint16, dtypes.uint16), dtypes.fp8e4m3: (np.uint8, dtypes.uint8), dtypes.fp8e5m2: (np.uint8, dtypes.uint8)}


@pytest.fixture(autouse=True)
def claimed_dtypes(request: pytest.FixtureRequest) -> None:
  """Each test runs where the device renders its format (`dt`, or all three; float16 too where the test uses it)."""
  dt = getattr(getattr(request.node, "callspec", None), "params", {}).get("dt")
  for d in [dt] if dt is not None else LOWP: require_dtype(d)
  if "float16" in request.node.name: require_dtype(dtypes.float16)


def ml(dt: DType):
  """The ml_dtypes numpy type of `dt` (the test fails without ml_dtypes, naming the extra that installs it)."""
  m = oracle_module("ml_dtypes", "bfloat16 and fp8")
  return {dtypes.bfloat16: m.bfloat16, dtypes.fp8e4m3: m.float8_e4m3fn, dtypes.fp8e5m2: m.float8_e5m2}[dt]


def roundtrip(x: np.ndarray, dt: DType) -> np.ndarray:
  """float32 -> dt -> float32 on the device under test."""
  return Tensor(np.asarray(x, np.float32)).cast(dt).cast(dtypes.float32).numpy()


def oracle(x: np.ndarray, dt: DType) -> np.ndarray:
  """`x` rounded to `dt` by ml_dtypes, E4M3 saturating (ml_dtypes makes NaN of what lies past 464: clip to it first)."""
  x = np.asarray(x, np.float32)
  if dt == dtypes.fp8e4m3: x = np.where(np.isnan(x), x, np.clip(x, -464, 464)).astype(np.float32)
  return x.astype(ml(dt)).astype(np.float32)


def same(got: np.ndarray, want: np.ndarray, msg: str = "") -> None:
  """Bit-for-bit float equality (NaN matches NaN, -0.0 must be -0.0)."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  bad = ~((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)))
  assert not bad.any(), f"{msg}: {int(bad.sum())} of {bad.size} differ, e.g. at {np.argwhere(bad)[:5].ravel().tolist()}: got " \
                        f"{got[bad][:5].tolist()}, want {want[bad][:5].tolist()}"


def all_values(dt: DType) -> np.ndarray:
  """Every finite value of `dt` as float32, ascending, without duplicates (-0.0 dropped)."""
  npt, _ = BITS[dt]
  v = np.arange(np.iinfo(npt).max + 1, dtype=np.uint64).astype(npt).view(ml(dt)).astype(np.float32)
  return np.unique(v[np.isfinite(v)])


def probe_values(dt: DType) -> np.ndarray:
  """Every finite value, every midpoint between neighbours (the ties) and the float32 values just below and above each
  midpoint, both signs, capped to where E4M3 rounds rather than saturates."""
  v = all_values(dt)
  v = v[v >= 0]
  if dt == dtypes.fp8e4m3: v = np.append(v, 480.0).astype(np.float32)  # the absent next step: its midpoint 464 still rounds to 448
  mid = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
  assert ((v[:-1].astype(np.float64) + v[1:]) / 2 == mid).all(), "midpoints must be exact in float32"
  x = np.concatenate([v, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))])
  if dt == dtypes.fp8e4m3: x = x[x <= 464]
  if dt == dtypes.bfloat16: x = x[::7]  # 1/7 of the 260k bf16 probes keeps the PYTHON device fast; every kind is still in
  return np.concatenate([x, -x]).astype(np.float32)


# ***** casts *****

@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_cast_from_float32_rounds_to_nearest_even(dt: DType):
  x = probe_values(dt)
  same(roundtrip(x, dt), oracle(x, dt), f"float32 -> {dt.name}")


@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_decode_every_bit_pattern(dt: DType):
  npt, bdt = BITS[dt]
  codes = np.arange(np.iinfo(npt).max + 1, dtype=np.uint64).astype(npt)
  if dt == dtypes.bfloat16: codes = codes[(codes & 0xff) < 16]  # every exponent and sign, low mantissa bits in part
  got = Tensor(codes).bitcast(dt).cast(dtypes.float32).numpy()
  same(got, codes.view(ml(dt)).astype(np.float32), f"{dt.name} bit patterns -> float32")


def test_ocp_specials_and_saturation():
  """Values of the OCP specification (no oracle needed): E4M3 max 448, no inf (saturates), NaN; E5M2 max 57344, inf."""
  inf, nan = np.inf, np.nan
  e4 = roundtrip([448, 449, 463.9, 464, 465, 1e6, inf, -inf, -500, nan, 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -9, 2.0 ** -6 * 0.9375], dtypes.fp8e4m3)
  same(e4, [448, 448, 448, 448, 448, 448, 448, -448, -448, nan, 2.0 ** -9, 0, 2.0 ** -8, 2.0 ** -6], "E4M3 specials")
  e5 = roundtrip([57344, 61439, 61440, 1e6, inf, -inf, nan, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17, 1.5, 0.3, 100], dtypes.fp8e5m2)
  same(e5, [57344, 57344, inf, inf, inf, -inf, nan, 2.0 ** -16, 0, 2.0 ** -15, 1.5, 0.3125, 96], "E5M2 specials")
  same(roundtrip([1.5, 0.3, 100], dtypes.fp8e4m3), [1.5, 0.3125, 96], "E4M3 (issue 16's example)")
  b = roundtrip([inf, -inf, nan, 3.39e38, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20, -0.0, 1e-40], dtypes.bfloat16)
  same(b, [inf, -inf, nan, 3.3895313892515355e38, 1, 1 + 2.0 ** -6, 1 + 2.0 ** -7, -0.0, 9.183549615799121e-41], "bfloat16 specials")


@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_casts_to_and_from_ints_and_float16(dt: DType):
  ints = np.array([0, 1, -1, 7, 17, 255, 257, 259, -1000, 4097, 12345, 2 ** 20 + 3], np.int32)
  if dt == dtypes.fp8e4m3: ints = ints[np.abs(ints) <= 448]
  got = Tensor(ints).cast(dt).cast(dtypes.float32).numpy()
  same(got, ints.astype(np.float32).astype(ml(dt)).astype(np.float32), f"int32 -> {dt.name}")
  v = oracle(np.array([2.5, -2.5, 3.75, -0.75, 100.0, -7.9], np.float32), dt)
  lp = Tensor(v).cast(dt)
  np.testing.assert_array_equal(lp.cast(dtypes.int32).numpy(), np.trunc(v).astype(np.int32), err_msg=f"{dt.name} -> int32")
  np.testing.assert_array_equal(lp.cast(dtypes.bool).numpy(), v != 0)
  same(lp.cast(dtypes.float16).cast(dtypes.float32).numpy(), v.astype(np.float16).astype(np.float32), f"{dt.name} -> float16")
  h = np.array([0.1, 1.2345, -3.3, 65504, 6e-5, -1e-7], np.float16)
  same(Tensor(h).cast(dt).cast(dtypes.float32).numpy(), oracle(h.astype(np.float32), dt), f"float16 -> {dt.name}")


# ***** arithmetic, reductions, matmul *****

def lowp_inputs(dt: DType, n: int, seed: int, scale: float = 4.0) -> np.ndarray:
  """Random float32 values that are exactly representable in `dt`."""
  return oracle(np.random.default_rng(seed).uniform(-scale, scale, n).astype(np.float32), dt)


@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_arithmetic_rounds_once(dt: DType):
  a, b = lowp_inputs(dt, 257, 0), lowp_inputs(dt, 257, 1)
  b[np.abs(b) < 0.25] = 1  # no quotient past the formats' range
  ta, tb = Tensor(a).cast(dt), Tensor(b).cast(dt)
  for name, got, want in (("add", ta + tb, a + b), ("sub", ta - tb, a - b), ("mul", ta * tb, a * b), ("neg", -ta, -a),
                          ("max", ta.maximum(tb), np.maximum(a, b)), ("where", (ta < tb).where(ta, tb), np.where(a < b, a, b))):
    assert got.dtype == dt, f"{name} of {dt.name} gave {got.dtype}"
    same(got.cast(dtypes.float32).numpy(), oracle(want, dt), f"{dt.name} {name}")
  np.testing.assert_array_equal((ta < tb).numpy(), a < b)
  # division, sqrt, exp2: the float32 result rounded once; a float32 ulp of difference in the function is tolerated
  for name, got, want in (("div", ta / tb, a / b), ("sqrt", ta.abs().sqrt(), np.sqrt(np.abs(a))), ("exp2", ta.exp2(), np.exp2(a))):
    g, w = got.cast(dtypes.float32).numpy(), want.astype(np.float32)
    ok = np.zeros(g.shape, bool)
    for f in (1.0, 1 + 2.0 ** -20, 1 - 2.0 ** -20): ok |= g == oracle(w * np.float32(f), dt)
    assert ok.all(), f"{dt.name} {name}: got {g[~ok][:5].tolist()} for {w[~ok][:5].tolist()}"


@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_sum_accumulates_in_float32(dt: DType):
  """Each partial sum of these values is exact in float32 but not in `dt`: a low-precision accumulator fails."""
  q = {dtypes.bfloat16: 0.25, dtypes.fp8e4m3: 0.125, dtypes.fp8e5m2: 0.5}[dt]
  x = np.random.default_rng(2).integers(1, 4, (8, 513)).astype(np.float32) * q
  t = Tensor(x).cast(dt)
  same(t.sum(axis=1).cast(dtypes.float32).numpy(), oracle(x.sum(axis=1), dt), f"{dt.name} sum(axis=1)")
  same(t.sum().cast(dtypes.float32).numpy(), oracle(x.sum(), dt), f"{dt.name} sum()")
  assert t.sum().dtype == dt


@pytest.mark.parametrize("dt", LOWP, ids=IDS)
def test_matmul_accumulates_in_float32(dt: DType):
  rs = np.random.default_rng(3)
  a = rs.integers(-2, 3, (9, 300)).astype(np.float32)  # every product (0, 0.5, 1, 2, 4) exact in each format: only the
  b = rs.integers(-2, 3, (300, 5)).astype(np.float32) * 0.5  # accumulation can go wrong
  got = (Tensor(a).cast(dt) @ Tensor(b).cast(dt))
  assert got.dtype == dt
  same(got.cast(dtypes.float32).numpy(), oracle(a @ b, dt), f"{dt.name} matmul")
