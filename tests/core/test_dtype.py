"""dtype.py: scalar/vector/pointer dtypes, numpy mapping, to_dtype, the promotion lattice, constant truncation,
and the bf16/fp8 converters (checked against a float64 reference written here and, when installed, ml_dtypes)."""
import itertools
import math
import pickle
import struct
import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from plugrad.dtype import (DTYPES_DICT, PROMO_LATTICE, AddrSpace, DType, PtrDType, bf16_to_f32, dtypes, f32_to_bf16, f32_to_fp8, fp8_to_f32,
                           least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype, truncate)

try:
  import ml_dtypes
except ImportError:  # the float64 reference below still runs
  ml_dtypes = None
needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed")

SCALARS = list(DTYPES_DICT.values())
INT_DTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
NP_DTS = [d for d in SCALARS if d.np is not None]
FP8 = {dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2)}
scalar_dt = st.sampled_from(SCALARS)


def f32(x) -> float: return struct.unpack("f", struct.pack("f", x))[0]
def bits_to_f32(u: int) -> np.float32: return np.array([u], np.uint32).view(np.float32)[0]


# ***** basic properties *****
class TestScalars:
  def test_every_scalar_is_listed(self):
    assert {d.name for d in SCALARS} == {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "fp8e4m3",
                                          "fp8e5m2", "float16", "bfloat16", "float32", "float64"}
    assert dtypes.fields() == DTYPES_DICT and dtypes.fields() is not DTYPES_DICT
    assert len({d.priority for d in SCALARS}) == len(SCALARS)  # priorities are distinct

  @pytest.mark.parametrize("dt", NP_DTS, ids=str)
  def test_itemsize_matches_numpy(self, dt):
    assert dt.itemsize == dt.np.itemsize

  @pytest.mark.parametrize("dt", INT_DTS, ids=str)
  def test_int_min_max_match_numpy(self, dt):
    info = np.iinfo(dt.np)
    assert (dtypes.min(dt), dtypes.max(dt)) == (int(info.min), int(info.max))
    assert dtypes.min(dt.vec(4)) == info.min and dtypes.max(dt.vec(4)) == info.max

  @pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64], ids=str)
  def test_float_finfo_matches_numpy(self, dt):
    info = np.finfo(dt.np)
    assert dtypes.finfo(dt) == (info.nexp, info.nmant)
    assert dtypes.min(dt) == -math.inf and dtypes.max(dt) == math.inf

  @needs_ml_dtypes
  @pytest.mark.parametrize("dt,name", [(dtypes.bfloat16, "bfloat16"), (dtypes.fp8e4m3, "float8_e4m3fn"), (dtypes.fp8e5m2, "float8_e5m2")], ids=str)
  def test_ml_dtypes_finfo(self, dt, name):
    mdt = getattr(ml_dtypes, name)
    info = ml_dtypes.finfo(mdt)
    assert dtypes.finfo(dt) == (info.nexp, info.nmant) and dt.itemsize == np.dtype(mdt).itemsize
    assert float(fp8_to_f32(0x7E if dt == dtypes.fp8e4m3 else 0x7B, dt)) == float(info.max) if dt in FP8 else True

  def test_bool_index_void(self):
    assert (dtypes.min(dtypes.bool), dtypes.max(dtypes.bool)) == (False, True) and dtypes.bool.itemsize == 1
    assert (dtypes.min(dtypes.index), dtypes.max(dtypes.index)) == (-2**63, 2**63 - 1) and dtypes.is_int(dtypes.index)
    assert dtypes.void.itemsize == 0 and dtypes.void.np is None and dtypes.index.np is None
    assert dtypes.index not in SCALARS and dtypes.void not in SCALARS
    with pytest.raises(TypeError): dtypes.finfo(dtypes.int32)

  def test_predicates(self):
    for d in SCALARS:
      kinds = (dtypes.is_float(d), dtypes.is_int(d), dtypes.is_bool(d))
      assert sum(kinds) == 1, d
      assert dtypes.is_unsigned(d) == d.name.startswith("uint")
      assert dtypes.is_float(d) == (d.name.startswith(("float", "fp8")) or d == dtypes.bfloat16)
      assert dtypes.is_float(d.vec(2)) == dtypes.is_float(d) and dtypes.is_int(d.vec(2)) == dtypes.is_int(d)

  def test_aliases(self):
    assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
    assert (dtypes.char, dtypes.uchar, dtypes.short, dtypes.ushort) == (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)
    assert (dtypes.int, dtypes.uint, dtypes.long, dtypes.ulong) == (dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64)
    assert dtypes.default_float == dtypes.float32 and dtypes.default_int == dtypes.int32

  def test_from_py(self):
    assert dtypes.from_py(True) == dtypes.bool and dtypes.from_py(3) == dtypes.default_int and dtypes.from_py(3.0) == dtypes.default_float
    assert dtypes.from_py([1, [2, 3.5]]) == dtypes.default_float and dtypes.from_py((True, 1)) == dtypes.default_int
    assert dtypes.from_py([]) == dtypes.default_float
    with pytest.raises(TypeError): dtypes.from_py("x")


class TestNumpyMapping:
  @pytest.mark.parametrize("dt", NP_DTS, ids=str)
  def test_round_trip(self, dt):
    assert dtypes.from_np(dt.np) is dt and dtypes.from_np(dt.np.type) is dt and to_dtype(dt.np) is dt

  @pytest.mark.parametrize("npt", [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16,
                                   np.float32, np.float64])
  def test_numpy_to_plugrad_to_numpy(self, npt):
    assert dtypes.from_np(npt).np == np.dtype(npt)

  def test_no_numpy_type(self):
    for d in (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float32.vec(4), dtypes.index, dtypes.void): assert d.np is None
    for npt in (np.complex64, np.complex128, np.str_, object):
      with pytest.raises(TypeError): dtypes.from_np(npt)


# ***** vectors and pointers *****
class TestVecPtr:
  @pytest.mark.parametrize("dt", SCALARS, ids=str)
  def test_vec(self, dt):
    v = dt.vec(4)
    assert v.count == v.vcount == 4 and v.itemsize == 4 * dt.itemsize and v.scalar() is dt and v.base is v
    assert v.name.startswith(dt.name) and v.name != dt.name and repr(v) == f"dtypes.{dt.name}.vec(4)"
    assert v == dt.vec(4) and hash(v) == hash(dt.vec(4)) and v != dt.vec(2) and v != dt
    assert dt.vec(1) is dt and dt.scalar() is dt and repr(dt) == f"dtypes.{dt.name}"

  def test_vec_errors_and_void(self):
    assert dtypes.void.vec(4) is dtypes.void
    with pytest.raises(ValueError): dtypes.float32.vec(4).vec(2)
    with pytest.raises(ValueError): dtypes.float32.vec(-1)
    with pytest.raises(ValueError): dtypes.float32.vec(2.0)

  def test_vec_distinct_across_scalars(self):
    vecs = [d.vec(n) for d in SCALARS for n in (2, 3, 4, 8, 16)]
    assert len(set(vecs)) == len(vecs) and len({v.name for v in vecs}) == len(vecs)

  def test_ptr(self):
    p = dtypes.float32.ptr()
    assert isinstance(p, PtrDType) and p.base is dtypes.float32 and p.addrspace is AddrSpace.GLOBAL and p.size == -1 and p.v == 1
    assert p.itemsize == 4 and p.scalar() is p and p.vcount == 1 and p != dtypes.float32 and dtypes.float32 != p
    assert repr(p) == "dtypes.float32.ptr(addrspace=GLOBAL)"
    lp = dtypes.half.ptr(16, AddrSpace.LOCAL)
    assert lp.size == 16 and lp.addrspace is AddrSpace.LOCAL and repr(lp) == "dtypes.float16.ptr(size=16, addrspace=LOCAL)"
    assert dtypes.is_float(p) and not dtypes.is_int(p) and not dtypes.is_float(dtypes.int8.ptr())
    vp = dtypes.float32.vec(4).ptr()
    assert vp.base == dtypes.float32.vec(4) and vp.itemsize == 16
    with pytest.raises(TypeError): p.ptr()

  def test_ptr_equality_and_hash(self):
    ps = [d.ptr(size, a) for d in (dtypes.float32, dtypes.int32, dtypes.float32.vec(4)) for size in (-1, 16) for a in AddrSpace]
    assert len(set(ps)) == len(ps)
    for p in ps:
      same = p.base.ptr(p.size, p.addrspace)
      assert same == p and hash(same) == hash(p) and p != p.base
    assert dtypes.float32.ptr(addrspace=AddrSpace.REG) != dtypes.float32.ptr(addrspace=AddrSpace.LOCAL)

  def test_vector_of_pointers(self):
    p = dtypes.int32.ptr(8)
    pv = p.vec(4)
    assert pv.v == pv.vcount == 4 and pv.scalar() == p and pv.base is dtypes.int32 and pv != p and p.vec(1) is p
    assert repr(pv) == "dtypes.int32.ptr(size=8, addrspace=GLOBAL).vec(4)"
    with pytest.raises(ValueError): pv.vec(2)

  def test_addrspace(self):
    assert [a.value for a in AddrSpace] == ["global", "local", "reg"]

  @pytest.mark.parametrize("dt", [*SCALARS, dtypes.void, dtypes.index, dtypes.float32.vec(4), dtypes.uint8.vec(16), dtypes.float32.ptr(),
                                  dtypes.half.ptr(64, AddrSpace.LOCAL), dtypes.int32.vec(2).ptr(8, AddrSpace.REG),
                                  dtypes.float32.ptr(8).vec(4)], ids=repr)
  def test_pickle(self, dt):
    back = pickle.loads(pickle.dumps(dt))
    assert back == dt and hash(back) == hash(dt) and type(back) is type(dt) and repr(back) == repr(dt)
    if dt.count == 1 and not isinstance(dt, PtrDType): assert back is dt  # scalars unpickle to the singletons

  def test_dtype_is_frozen(self):
    with pytest.raises(AttributeError): dtypes.float32.itemsize = 8  # type: ignore[misc]


# ***** to_dtype *****
class TestToDtype:
  @pytest.mark.parametrize("name", list(DTYPES_DICT))
  def test_names(self, name): assert to_dtype(name) is DTYPES_DICT[name]

  @pytest.mark.parametrize("alias,dt", [("half", dtypes.float16), ("float", dtypes.float32), ("double", dtypes.float64), ("long", dtypes.int64),
                                        ("int", dtypes.int32), ("bf16", dtypes.bfloat16), ("fp16", dtypes.float16), ("fp32", dtypes.float32),
                                        ("fp64", dtypes.float64)])
  def test_aliases(self, alias, dt): assert to_dtype(alias) is dt

  def test_other_inputs(self):
    for d in (*SCALARS, dtypes.float32.vec(4), dtypes.int8.ptr()): assert to_dtype(d) is d
    assert to_dtype(bool) is dtypes.bool and to_dtype(int) is dtypes.default_int and to_dtype(float) is dtypes.default_float
    assert to_dtype(np.float16) is dtypes.float16 and to_dtype(np.dtype("uint32")) is dtypes.uint32 and to_dtype(np.bool_) is dtypes.bool

  @pytest.mark.parametrize("bad", ["float128", "Float32", "", "int4", np.complex64, np.dtype("U3"), complex])
  def test_errors(self, bad):
    with pytest.raises(TypeError): to_dtype(bad)

  def test_error_lists_names(self):
    with pytest.raises(TypeError, match="float32"): to_dtype("nope")


# ***** promotion *****
_WEAK = next(d for d in PROMO_LATTICE if d not in SCALARS)  # the weak-float node between the ints and the floats


def reach(a: DType) -> set[DType]:
  """Everything `a` promotes to along PROMO_LATTICE edges (an independent walk of the edges)."""
  seen, todo = {a}, [a]
  while todo:
    for b in PROMO_LATTICE.get(todo.pop(), ()):
      if b not in seen: seen.add(b); todo.append(b)
  return seen


def join(*ds: DType) -> DType:
  """The lattice join with the weak float kept (not materialised as default_float): the least common bound, or, where
  there is no least one, the lowest-priority minimal one."""
  common = set.intersection(*(reach(d) for d in ds))
  minimal = [c for c in common if not any(o != c and c in reach(o) for o in common)]
  return min(minimal, key=lambda d: d.priority)


def _weak_materialised(a, b, c) -> bool:
  """A signed int and uint64 meet at the weak float, which becomes default_float; a 16-bit or fp8 float met afterwards
  then gives float32, but met first it absorbs the ints: (int64+uint64)+float16 = float32, int64+(uint64+float16) = float16."""
  s = {a, b, c}
  return dtypes.uint64 in s and bool(s & {dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64}) and \
    bool(s & {dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16, dtypes.bfloat16})


def _fp8_tie(a, b, c) -> bool:
  """fp8e4m3 and fp8e5m2 have two minimal bounds (float16, bfloat16); priority picks float16, so (e4m3+e5m2)+bf16 =
  float32 while e4m3+(e5m2+bf16) = bfloat16. No single-dtype answer for e4m3+e5m2 can make this associative."""
  return {a, b, c} == {dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16}


class TestPromotion:
  def test_lattice_is_a_dag_over_the_scalars(self):
    assert set(PROMO_LATTICE) | {dtypes.float64} == set(SCALARS) | {_WEAK}
    for a in PROMO_LATTICE:
      for b in PROMO_LATTICE[a]: assert a not in reach(b), f"cycle through {a} -> {b}"
      assert all(a.priority < b.priority or b is _WEAK for b in PROMO_LATTICE[a])  # edges go up in priority (weak float ties uint64)
    assert all(dtypes.float64 in reach(d) for d in SCALARS)  # float64 is the top

  @pytest.mark.parametrize("a,b", list(itertools.product(SCALARS, SCALARS)), ids=str)
  def test_pair(self, a, b):
    r = least_upper_dtype(a, b)
    assert r == least_upper_dtype(b, a)  # commutative
    assert r in reach(a) and r in reach(b)  # an upper bound of both, along the lattice
    j = join(a, b)
    assert r == (dtypes.default_float if j is _WEAK else j)  # and the least one
    assert least_upper_dtype(a, b, b) == r and least_upper_dtype(r, a) == r  # absorbs

  @pytest.mark.parametrize("dt", SCALARS, ids=str)
  def test_idempotent_and_vectors(self, dt):
    assert least_upper_dtype(dt) is dt and least_upper_dtype(dt, dt) is dt and least_upper_dtype(dt, dt, dt) is dt
    assert least_upper_dtype(dt.vec(4), dtypes.bool) == least_upper_dtype(dt, dtypes.bool)  # vectors promote by their scalar

  def test_errors(self):
    with pytest.raises(ValueError): least_upper_dtype()
    for bad in (dtypes.index, dtypes.void, dtypes.float32.ptr()):
      with pytest.raises(TypeError): least_upper_dtype(dtypes.float32, bad)

  def test_associative_exhaustive(self):
    """Every triple: associative except the two documented families; the n-ary call equals the weak-float join."""
    odd = []
    for a, b, c in itertools.product(SCALARS, repeat=3):
      left, right = least_upper_dtype(least_upper_dtype(a, b), c), least_upper_dtype(a, least_upper_dtype(b, c))
      if left != right: odd.append((a, b, c))
      j = join(a, b, c)
      assert least_upper_dtype(a, b, c) == (dtypes.default_float if j is _WEAK else j)
    assert odd and all(_weak_materialised(*t) or _fp8_tie(*t) for t in odd)
    assert (dtypes.int64, dtypes.uint64, dtypes.float16) in odd and (dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.bfloat16) in odd

  @given(scalar_dt, scalar_dt, scalar_dt)
  def test_associative(self, a, b, c):
    assert least_upper_dtype(a, b, c) == least_upper_dtype(c, a, b) == least_upper_dtype(b, c, a)  # n-ary: order free
    assume(not _weak_materialised(a, b, c) and not _fp8_tie(a, b, c))
    assert least_upper_dtype(least_upper_dtype(a, b), c) == least_upper_dtype(a, least_upper_dtype(b, c)) == least_upper_dtype(a, b, c)

  def test_hash_seed_independent(self):
    # uint64 and the weak float share priority 8: the answer must come from the order, not from set iteration order
    for d in (dtypes.bool, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64):
      assert least_upper_dtype(d, dtypes.uint64) is dtypes.uint64
    assert sum_acc_dtype(dtypes.uint64) is dtypes.uint64

  # JAX's documented binary promotion table (docs.jax.dev, "Type promotion semantics", jnp.promote_types), the rows and
  # columns for bool, unsigned, signed and the four IEEE/bf16 floats. "f*" is JAX's weak float: a u64 with a signed int.
  JAX_TABLE = """
       b1 u1 u2 u4 u8 i1 i2 i4 i8 bf f2 f4 f8
    b1 b1 u1 u2 u4 u8 i1 i2 i4 i8 bf f2 f4 f8
    u1 u1 u1 u2 u4 u8 i2 i2 i4 i8 bf f2 f4 f8
    u2 u2 u2 u2 u4 u8 i4 i4 i4 i8 bf f2 f4 f8
    u4 u4 u4 u4 u4 u8 i8 i8 i8 i8 bf f2 f4 f8
    u8 u8 u8 u8 u8 u8 f* f* f* f* bf f2 f4 f8
    i1 i1 i2 i4 i8 f* i1 i2 i4 i8 bf f2 f4 f8
    i2 i2 i2 i4 i8 f* i2 i2 i4 i8 bf f2 f4 f8
    i4 i4 i4 i4 i8 f* i4 i4 i4 i8 bf f2 f4 f8
    i8 i8 i8 i8 i8 f* i8 i8 i8 i8 bf f2 f4 f8
    bf bf bf bf bf bf bf bf bf bf bf f4 f4 f8
    f2 f2 f2 f2 f2 f2 f2 f2 f2 f2 f4 f2 f4 f8
    f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f4 f8
    f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8
  """
  # plugrad has no weak types: where JAX answers f*, plugrad answers dtypes.default_float (float32). JAX itself gives
  # float32 there too unless jax_enable_x64 is on (then float64).
  JAX_NAMES = {"b1": dtypes.bool, "u1": dtypes.uint8, "u2": dtypes.uint16, "u4": dtypes.uint32, "u8": dtypes.uint64, "i1": dtypes.int8,
               "i2": dtypes.int16, "i4": dtypes.int32, "i8": dtypes.int64, "bf": dtypes.bfloat16, "f2": dtypes.float16, "f4": dtypes.float32,
               "f8": dtypes.float64, "f*": dtypes.default_float}

  def test_matches_jax_table(self):
    rows = [r.split() for r in self.JAX_TABLE.strip().splitlines()]
    cols, checked = rows[0], 0
    for row in rows[1:]:
      for col, want in zip(cols, row[1:]):
        assert least_upper_dtype(self.JAX_NAMES[row[0]], self.JAX_NAMES[col]) == self.JAX_NAMES[want], (row[0], col)
        checked += 1
    assert checked == 13 * 13

  def test_spot_checks_and_deliberate_differences(self):
    lub = least_upper_dtype
    assert lub(dtypes.int8, dtypes.uint8) is dtypes.int16 and lub(dtypes.int32, dtypes.uint32) is dtypes.int64
    assert lub(dtypes.int64, dtypes.uint64) is dtypes.default_float  # numpy: float64; JAX: weak float
    assert lub(dtypes.int32, dtypes.float16) is dtypes.float16  # numpy: float64
    assert lub(dtypes.int64, dtypes.float32) is dtypes.float32  # numpy: float64
    assert lub(dtypes.bfloat16, dtypes.float16) is dtypes.float32
    # fp8 (JAX and torch refuse to promote fp8 with other floats): any int or bool goes to the fp8 type, fp8 to the 16-bit floats
    assert lub(dtypes.int64, dtypes.fp8e4m3) is dtypes.fp8e4m3 and lub(dtypes.bool, dtypes.fp8e5m2) is dtypes.fp8e5m2
    assert lub(dtypes.fp8e4m3, dtypes.float16) is dtypes.float16 and lub(dtypes.fp8e5m2, dtypes.bfloat16) is dtypes.bfloat16
    assert lub(dtypes.fp8e4m3, dtypes.fp8e5m2) is dtypes.float16  # no least bound: priority picks float16 over bfloat16
    assert lub(dtypes.fp8e4m3, dtypes.float32) is dtypes.float32

  def test_default_float_is_used(self, monkeypatch):
    monkeypatch.setattr(dtypes, "default_float", dtypes.float16)
    assert least_upper_dtype(dtypes.int64, dtypes.uint64) is dtypes.float16 and least_upper_float(dtypes.int32) is dtypes.float16

  def test_least_upper_float(self):
    for d in SCALARS:
      want = d if dtypes.is_float(d) else dtypes.default_float
      assert least_upper_float(d) is want
    assert least_upper_float(dtypes.float16.vec(4)) == dtypes.float16.vec(4)

  SUM_ACC = {dtypes.bool: dtypes.int32, dtypes.int8: dtypes.int32, dtypes.int16: dtypes.int32, dtypes.int32: dtypes.int32,
             dtypes.int64: dtypes.int64, dtypes.uint8: dtypes.uint32, dtypes.uint16: dtypes.uint32, dtypes.uint32: dtypes.uint32,
             dtypes.uint64: dtypes.uint64, dtypes.fp8e4m3: dtypes.float32, dtypes.fp8e5m2: dtypes.float32, dtypes.float16: dtypes.float32,
             dtypes.bfloat16: dtypes.float32, dtypes.float32: dtypes.float32, dtypes.float64: dtypes.float64}

  @pytest.mark.parametrize("dt", SCALARS, ids=str)
  def test_sum_acc_dtype(self, dt): assert sum_acc_dtype(dt) is self.SUM_ACC[dt] and sum_acc_dtype(dt.vec(4)) is self.SUM_ACC[dt]


# ***** constant truncation *****
def np_int_cast(x: int, dt: DType) -> int:
  """numpy's wrap-around: the value mod 2**64 as uint64, then cast down (numpy int->int casts wrap)."""
  return int(np.array([x % 2**64], np.uint64).astype(dt.np)[0])


class TestTruncate:
  @pytest.mark.parametrize("dt", INT_DTS, ids=str)
  def test_int_edges(self, dt):
    lo, hi, t = dtypes.min(dt), dtypes.max(dt), truncate(dt)
    span = 2 ** (8 * dt.itemsize)
    for x in (lo, hi, lo - 1, hi + 1, 0, -1, span, -span, 3 * span + 5, -(2**100) - 7):
      assert t(x) == np_int_cast(x, dt), x
    assert t(hi + 1) == lo and t(lo - 1) == hi  # wraps both ways

  @settings(max_examples=300, deadline=None)
  @given(st.sampled_from(INT_DTS), st.integers(-(2**80), 2**80))
  def test_int_wraparound(self, dt, x):
    r = truncate(dt)(x)
    assert type(r) is int and r == np_int_cast(x, dt) and dtypes.min(dt) <= r <= dtypes.max(dt)

  @settings(max_examples=300, deadline=None)
  @given(st.sampled_from(INT_DTS), st.floats(-(2.0**62), 2.0**62, allow_nan=False))
  def test_float_to_int_truncates_toward_zero(self, dt, x):
    assert truncate(dt)(x) == np_int_cast(int(np.float64(x).astype(np.int64)), dt)

  def test_int_from_nonfinite_is_zero(self):
    for dt in INT_DTS: assert truncate(dt)(math.inf) == 0 and truncate(dt)(math.nan) == 0

  def test_bool_index_f64(self):
    assert [truncate(dtypes.bool)(x) for x in (0, 2, -1, 0.0, 0.5, math.nan)] == [False, True, True, False, True, True]
    assert truncate(dtypes.index)(2**70) == 2**70 and truncate(dtypes.index)(-3.7) == -3
    assert truncate(dtypes.float64)(3) == 3.0 and type(truncate(dtypes.float64)(3)) is float
    assert truncate(dtypes.int8.vec(4))(300) == 44  # a vector truncates like its scalar
    with pytest.raises(TypeError): truncate(dtypes.void)

  @settings(max_examples=400, deadline=None)
  @given(st.sampled_from([dtypes.float16, dtypes.float32]), st.floats(allow_nan=False, allow_infinity=True))
  def test_float_rounding_matches_numpy(self, dt, x):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on overflow to inf
      want = float(np.float64(x).astype(dt.np))
    got = truncate(dt)(x)
    assert got == want and math.copysign(1, got) == math.copysign(1, want)

  @pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32], ids=str)
  def test_float_ties_and_overflow(self, dt):
    t, npdt = truncate(dt), dt.np
    rng = np.random.default_rng(1)
    bits = rng.integers(0, np.iinfo(np.uint16 if dt == dtypes.float16 else np.uint32).max, 2000)
    vals = bits.astype(np.uint16 if dt == dtypes.float16 else np.uint32).view(npdt)
    vals = vals[np.isfinite(vals)]
    up = np.nextafter(vals, np.array(np.inf, npdt))
    ok = np.isfinite(up)
    mids = (vals[ok].astype(np.float64) + up[ok].astype(np.float64)) / 2  # exact midpoints between neighbours
    for m, a, b in zip(mids, vals[ok], up[ok]):
      even = a if int(np.array(a).view(np.uint16 if dt == dtypes.float16 else np.uint32)) % 2 == 0 else b
      assert t(float(m)) == float(even)
    big = float(np.finfo(npdt).max)
    ulp = big - float(np.nextafter(np.array(big, npdt), np.array(0, npdt)))
    assert t(big + ulp / 2 - ulp / 1024) == big and t(big + ulp / 2) == math.inf and t(-big - ulp) == -math.inf
    assert math.isnan(t(math.nan)) and t(math.inf) == math.inf and math.copysign(1, t(-0.0)) == -1

  def test_bf16_fp8_constants(self):
    assert truncate(dtypes.bfloat16)(1 + 2**-9) == 1.0 and truncate(dtypes.bfloat16)(3.0) == 3.0
    assert truncate(dtypes.fp8e4m3)(1000.0) == 448.0 and truncate(dtypes.fp8e4m3)(-math.inf) == -448.0
    assert truncate(dtypes.fp8e5m2)(1e6) == math.inf and truncate(dtypes.fp8e5m2)(0.3) == 0.3125
    assert math.isnan(truncate(dtypes.fp8e4m3)(math.nan)) and math.isnan(truncate(dtypes.bfloat16)(math.nan))
    # constants go through float32 first (as ml_dtypes does): 1+2**-8+2**-30 is 1+2**-8 in float32, a tie that rounds to 1
    assert truncate(dtypes.bfloat16)(1 + 2**-8 + 2**-30) == 1.0
    assert dtypes.as_const(300, dtypes.uint8) == 44 and dtypes.as_const((1.5, 257), dtypes.int8) == (1, 1)


# ***** bf16 / fp8 against a float64 reference *****
def ref_round(x: float, ebits: int, mbits: int) -> float:
  """`x` (a finite float) rounded to nearest-even onto a binary format with `ebits`/`mbits` and IEEE subnormals, ignoring
  the top of the range (callers handle overflow). Works in float64, where scaling by powers of two is exact."""
  if x == 0: return x
  emin = 2 - (1 << (ebits - 1))  # 1 - bias
  e = max(math.frexp(abs(x))[1] - 1, emin)  # exponent of the binade (subnormals share emin's quantum)
  q = 2.0 ** (e - mbits)
  return math.copysign(round(abs(x) / q) * q, x)  # round() on a float is round-half-even


def ref_bf16(x: float) -> float:
  if math.isnan(x) or math.isinf(x): return x
  r = ref_round(x, 8, 7)
  return r if abs(r) < 2.0 ** 128 else math.copysign(math.inf, x)


def ref_fp8(x: float, dt: DType) -> float:
  if math.isnan(x): return x
  if dt == dtypes.fp8e4m3: return math.copysign(min(abs(ref_round(x, 4, 3)) if math.isfinite(x) else math.inf, 448.0), x)
  if math.isinf(x): return x
  r = ref_round(x, 5, 2)
  return r if abs(r) <= 57344.0 else math.copysign(math.inf, x)


def spec_fp8(code: int, dt: DType) -> float:
  """The value the format spec gives for an fp8 code (OCP FP8: E4M3 'fn' bias 7 without inf; E5M2 bias 15 with inf)."""
  sign = -1.0 if code >> 7 else 1.0
  if dt == dtypes.fp8e4m3:
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7: return math.nan
    return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
  e, m = (code >> 2) & 0x1F, code & 0x3
  if e == 0x1F: return sign * math.inf if m == 0 else math.nan
  return sign * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))


def special_f32() -> np.ndarray:
  u = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 1, 0x807FFFFF, 0x007FFFFF, 0x00800000,
       0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x00008000, 0x00018000]
  return np.array(u, np.uint32).view(np.float32)


def random_f32(n: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  u = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
  u[: n // 4] = (u[: n // 4] & 0xFFFF0000) | 0x8000  # exact bf16 ties
  u[n // 4: n // 2] &= 0x807FFFFF  # denormals
  return np.concatenate([u.view(np.float32), special_f32()])


class TestBF16:
  def test_reference_on_sampled_floats(self):
    x = random_f32(20000, 0)
    got = bf16_to_f32(f32_to_bf16(x))
    for xi, gi in zip(x.tolist(), got.tolist()):
      want = ref_bf16(xi)
      if math.isnan(want): assert math.isnan(gi)
      else: assert gi == want and math.copysign(1, gi) == math.copysign(1, want), (xi, gi, want)

  def test_ties_to_even(self):
    for hi in (0x3F80, 0x3F81, 0x0001, 0x7F7E, 0x7F7F, 0xBF80, 0xBF81):
      tie = np.array([(hi << 16) | 0x8000], np.uint32).view(np.float32)
      assert int(f32_to_bf16(tie)[0]) == (hi if hi % 2 == 0 else hi + 1)
    assert int(f32_to_bf16(bits_to_f32(0x3F808001))) == 0x3F81 and int(f32_to_bf16(bits_to_f32(0x3F807FFF))) == 0x3F80

  def test_specials(self):
    assert f32_to_bf16(np.float32(np.inf)) == 0x7F80 and f32_to_bf16(np.float32(-np.inf)) == 0xFF80
    assert f32_to_bf16(bits_to_f32(0x7F7FFFFF)) == 0x7F80  # max float32 rounds up to inf
    assert f32_to_bf16(np.float32(-0.0)) == 0x8000
    for nanbits in (0x7FC00000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF):  # NaN stays NaN, also signalling NaNs with low payload
      out = f32_to_bf16(bits_to_f32(nanbits))
      assert math.isnan(float(bf16_to_f32(out))) and int(out) >> 15 == nanbits >> 31
    assert f32_to_bf16(np.float32(1.0)).dtype == np.uint16 and bf16_to_f32(np.uint16(0x3F80)).dtype == np.float32

  def test_all_codes_round_trip(self):
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    vals = bf16_to_f32(codes)
    assert np.array_equal(vals.view(np.uint32), codes.astype(np.uint32) << 16)
    back = f32_to_bf16(vals)
    finite = ~np.isnan(vals)
    assert np.array_equal(back[finite], codes[finite]) and np.isnan(bf16_to_f32(back[~finite])).all()

  @needs_ml_dtypes
  def test_bit_exact_vs_ml_dtypes(self):
    x = random_f32(400_000, 1)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    got = f32_to_bf16(x)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])  # ml_dtypes returns one canonical NaN; plugrad keeps sign and payload top bits
    assert np.isnan(bf16_to_f32(got[nan])).all()
    codes = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    dec = codes.view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(bf16_to_f32(codes), dec, equal_nan=True)


@pytest.mark.parametrize("dt", list(FP8), ids=str)
@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # numpy flags signalling NaN inputs
class TestFP8:
  def test_every_code_decodes_to_spec(self, dt):
    got = fp8_to_f32(np.arange(256, dtype=np.uint8), dt)
    assert got.dtype == np.float32
    for code in range(256):
      want, g = spec_fp8(code, dt), float(got[code])
      if math.isnan(want): assert math.isnan(g), hex(code)
      else: assert g == want and math.copysign(1, g) == math.copysign(1, want), hex(code)

  def test_spec_landmarks(self, dt):
    d = lambda c: float(fp8_to_f32(c, dt))
    if dt == dtypes.fp8e4m3:
      assert (d(0x7E), d(0x38), d(0xB8), d(0x08), d(0x01), d(0x07)) == (448.0, 1.0, -1.0, 2.0**-6, 2.0**-9, 7 * 2.0**-9)
      assert [c for c in range(256) if math.isnan(d(c))] == [0x7F, 0xFF] and not any(math.isinf(d(c)) for c in range(256))
    else:
      assert (d(0x7B), d(0x3C), d(0xBC), d(0x04), d(0x01)) == (57344.0, 1.0, -1.0, 2.0**-14, 2.0**-16)
      assert (d(0x7C), d(0xFC)) == (math.inf, -math.inf)
      assert [c for c in range(256) if math.isnan(d(c))] == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    assert d(0x00) == 0.0 and math.copysign(1, d(0x80)) == -1.0

  def test_encode_decode_identity(self, dt):
    codes = np.arange(256, dtype=np.uint8)
    vals = fp8_to_f32(codes, dt)
    back = f32_to_fp8(vals, dt)
    nonnan = ~np.isnan(vals)
    assert np.array_equal(back[nonnan], codes[nonnan])  # every finite code (and e5m2's +-inf)
    assert (back[~nonnan] == 0x7F).all() and back.dtype == np.uint8

  def test_midpoints_round_to_even(self, dt):
    codes = np.arange(256, dtype=np.uint8)
    vals = fp8_to_f32(codes, dt).astype(np.float64)
    for sign in (0, 0x80):
      pos = [c for c in range(sign, sign + 128) if math.isfinite(vals[c])]
      for a, b in zip(pos, pos[1:]):
        mid = (vals[a] + vals[b]) / 2
        assert np.float32(mid) == mid  # exact in float32
        even = a if a % 2 == 0 else b
        assert int(f32_to_fp8(np.float32(mid), dt)) == even, (hex(a), hex(b))
        # codes grow in magnitude for both signs: just past the midpoint goes to b, just short of it to a
        outward, inward = np.nextafter(np.float32(mid), np.float32(math.copysign(np.inf, mid))), np.nextafter(np.float32(mid), np.float32(0))
        assert int(f32_to_fp8(outward, dt)) == b and int(f32_to_fp8(inward, dt)) == a

  def test_underflow(self, dt):
    tiny = float(fp8_to_f32(1, dt))
    enc = lambda x: int(f32_to_fp8(np.float32(x), dt))
    assert enc(tiny / 2) == 0 and enc(-tiny / 2) == 0x80 and enc(tiny / 2 * 1.0001) == 1 and enc(tiny * 1.5) == 2 and enc(1e-30) == 0

  def test_overflow(self, dt):
    enc = lambda x: int(f32_to_fp8(np.float32(x), dt))
    if dt == dtypes.fp8e4m3:  # saturating, no inf
      for x in (448, 449, 464, 480, 1e6, 3.4e38, np.inf): assert enc(x) == 0x7E and enc(-x) == 0xFE
    else:  # IEEE-like: past half a step above the max, round to inf
      assert enc(57344) == 0x7B and enc(61439.996) == 0x7B and enc(61440) == 0x7C and enc(1e6) == 0x7C
      assert enc(np.inf) == 0x7C and enc(-np.inf) == 0xFC and enc(-61440) == 0xFC
    assert enc(np.nan) == 0x7F and enc(-np.nan) == 0x7F

  def test_reference_on_sampled_floats(self, dt):
    rng = np.random.default_rng(2)
    x = np.concatenate([(rng.standard_normal(6000) * 2.0 ** rng.integers(-24, 20, 6000)).astype(np.float32), random_f32(2000, 3)])
    got = fp8_to_f32(f32_to_fp8(x, dt), dt)
    for xi, gi in zip(x.tolist(), got.tolist()):
      want = ref_fp8(xi, dt)
      if math.isnan(want): assert math.isnan(gi)
      else: assert gi == want and math.copysign(1, gi) == math.copysign(1, want), (xi, gi, want)

  def test_not_fp8(self, dt):
    with pytest.raises(TypeError): f32_to_fp8(1.0, dtypes.float16)

  @needs_ml_dtypes
  def test_bit_exact_vs_ml_dtypes(self, dt):
    mdt = ml_dtypes.float8_e4m3fn if dt == dtypes.fp8e4m3 else ml_dtypes.float8_e5m2
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(fp8_to_f32(codes, dt), codes.view(mdt).astype(np.float32), equal_nan=True)
    rng = np.random.default_rng(4)
    x = np.concatenate([(rng.standard_normal(200_000) * 2.0 ** rng.integers(-24, 20, 200_000)).astype(np.float32), random_f32(100_000, 5)])
    # ml_dtypes' e4m3fn turns out-of-range values into NaN; plugrad saturates (checked in test_overflow), so compare in range
    keep = ~np.isnan(x) & ((np.abs(x) <= 464) if dt == dtypes.fp8e4m3 else True)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      want = x[keep].astype(mdt).view(np.uint8)
    assert np.array_equal(f32_to_fp8(x[keep], dt), want)
