"""Tensor ops mixin: elementwise math. Every method is a composition of Tensor's primitives (see plugrad/tensor.py).

Integer ops follow Python/torch semantics where C differs: `//` floors, `%` takes the divisor's sign, division by zero
gives 0 (numpy's value) instead of trapping, shifts past the bit width give 0 (or -1 for negative values shifted right).
Float transcendentals are built from EXP2/LOG2/SIN/SQRT/TRUNC with cancellation-free forms near their zeros.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from plugrad.errors import TensorError, TensorTypeError
from plugrad.dtype import DType, dtypes, least_upper_float
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.tensor import Tensor

_LN2 = math.log(2)


def _poly(x: Tensor, coeffs: list[float]) -> Tensor:
  """Horner evaluation of sum(c_i * x**i) with coefficients from the highest power down."""
  acc = x * coeffs[0] + coeffs[1]
  for c in coeffs[2:]: acc = acc * x + c
  return acc


def _need_int(t: Tensor, what: str) -> None:
  """Bitwise ops and shifts take ints and bools: a float operand (or a float Python scalar, which promotes the result) is
  a TensorTypeError, the TypeError that is also the RuntimeError tinygrad and torch raise."""
  if dtypes.is_float(t.dtype): raise TensorTypeError(f"{what} is only defined for integer and bool tensors, got {t.dtype}")


class ElementwiseMixin:
  __slots__ = ()

  # ***** dtype helpers *****
  def _floated(self: Any) -> Tensor: return self.cast(least_upper_float(self.dtype))
  def float(self: Any) -> Tensor: return self.cast(dtypes.float32)
  def half(self: Any) -> Tensor: return self.cast(dtypes.float16)
  def bfloat16(self: Any) -> Tensor: return self.cast(dtypes.bfloat16)
  def double(self: Any) -> Tensor: return self.cast(dtypes.float64)
  def int(self: Any) -> Tensor: return self.cast(dtypes.int32)
  def long(self: Any) -> Tensor: return self.cast(dtypes.int64)
  def short(self: Any) -> Tensor: return self.cast(dtypes.int16)
  def bool(self: Any) -> Tensor: return self.cast(dtypes.bool)

  # ***** division, modulo, power *****
  def _safe_divisor(self: Any, b: Tensor) -> Tensor:
    """b with the divisors that trap in C (0, and -1 for signed ints, where INT_MIN / -1 overflows) replaced by 1."""
    bad = b == 0
    if not dtypes.is_unsigned(b.dtype): bad = bad.logical_or(b == -1)
    return bad.where(1, b)

  def _int_divmod(self: Any, x: Any, reverse: bool, want_div: bool) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    if a.dtype == dtypes.bool: a, b = a.cast(dtypes.int8), b.cast(dtypes.int8)
    zero = b == 0
    safe = a._safe_divisor(b)
    q, r = a._alu(Ops.IDIV, safe), a._alu(Ops.MOD, safe)
    if not dtypes.is_unsigned(a.dtype):
      q = (b == -1).where(-a, q)
      # C truncates; move toward -inf when the remainder is non-zero and its sign differs from the divisor's.
      fix = (r != 0).logical_and((r < 0) != (safe < 0))
      q, r = fix.where(q - 1, q), fix.where(r + safe, r)
    return zero.where(0, q if want_div else r)

  def idiv(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """Integer division truncating toward zero (C semantics); x // 0 is 0."""
    a, b = self._broadcasted(x, reverse)
    _need_int(a, "idiv")
    q = a._alu(Ops.IDIV, a._safe_divisor(b))
    if not dtypes.is_unsigned(a.dtype): q = (b == -1).where(-a, q)
    return (b == 0).where(0, q)

  def floordiv(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """Python/torch floor division: ints floor toward -inf (x // 0 is 0), floats give floor(a / b)."""
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_float(a.dtype): return (a / b).floor()
    return a._int_divmod(b, False, True)

  def mod(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """Python/torch remainder: the result has the divisor's sign. Ints: x % 0 is 0; floats: a - b * floor(a / b)."""
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_float(a.dtype):
      r = a - b * (a / b).floor()
      return ((r != 0).logical_and((r < 0) != (b < 0))).where(r + b, r)
    return a._int_divmod(b, False, False)

  def _pow_int_const(self: Any, n: int) -> Tensor:
    """self ** n for a Python int n by square-and-multiply (exact for ints, numpy's accuracy for floats)."""
    if n < 0: return self._pow_int_const(-n).reciprocal()
    ret, base = self._const_like(1), self
    while n:
      if n & 1: ret = ret * base
      n >>= 1
      if n: base = base * base
    return ret

  def _pow_int_tensor(self: Any, e: Tensor) -> Tensor:
    """Integer power with an integer tensor exponent; negative exponents truncate like torch (1, +-1 or 0)."""
    ret, base = self._const_like(1), self
    for k in range(e.dtype.itemsize * 8 - (0 if dtypes.is_unsigned(e.dtype) else 1)):
      ret = ((e >> k) & 1).cast(dtypes.bool).where(ret * base, ret)
      base = base * base
    if dtypes.is_unsigned(e.dtype): return ret
    odd = (e & 1) != 0
    neg = (self == -1).where(odd.where(-1, 1), (self == 1).where(1, 0)).cast(self.dtype)
    return (e < 0).where(neg, ret)

  def pow(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """self ** x with broadcasting and promotion; 0 ** 0 is 1, negative bases take integer exponents, ints stay ints.

    Float results carry torch's derivatives (a CUSTOM_GRAD node) instead of those of the composite that computes the
    value: d/db = 0 where e == 0, else e * b**(e-1); d/de = 0 where b == 0 and e >= 0, else b**e * log(b) (nan for
    negative bases, as torch). The composite's own derivatives differ at the special values it sets by constants:
    0**1 (1), -inf**e for e > 1 (+-inf by e's parity), 0**e for e < 0 (-+inf)."""
    if not reverse and isinstance(x, float) and x == 0.5: return self.sqrt()  # sqrt's gradient, as torch (-inf at -0.0)
    ret = self._pow_value(x, reverse)
    if not dtypes.is_float(ret.dtype): return ret
    b, e = self._broadcasted(x, reverse)
    b, e = b.cast(ret.dtype), e.cast(ret.dtype)
    pairs = []
    if isinstance(self if not reverse else x, type(self)):  # the base is a tensor: d/db (a Python exponent's e-1 takes
      # the same fast paths as torch's self.pow(e - 1): 1.5 - 1 is a sqrt, nan at -inf)
      eb = b._pow_value(x - 1) if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool) else b._pow_value(e - 1)
      pairs += [b.uop, (e == 0).where(0.0, e * eb).uop]
    if isinstance(x if not reverse else self, type(self)):  # the exponent is a tensor: d/de
      pairs += [e.uop, ((b == 0).logical_and(e >= 0)).where(0.0, ret * b.log()).uop]
    return type(self)(UOp(Ops.CUSTOM_GRAD, ret.dtype, (ret.uop, *pairs)))

  def _pow_value(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """The value of self ** x (C99's pow special cases), as a composite of EXP2/LOG2 and selects."""
    if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer() and abs(x) <= 64:
      if dtypes.is_float(self.dtype) or isinstance(x, int):
        if not dtypes.is_float(self.dtype) and x < 0: raise TensorError(f"integers to negative integer powers are not allowed ({self.dtype} ** {x})")
        base = self.cast(dtypes.int8) if self.dtype == dtypes.bool else self
        return base._pow_int_const(int(x))
    if not reverse and isinstance(x, float) and x == 0.5: return self.sqrt()  # numpy's and torch's fast path (sqrt(-inf) is nan)
    b, e = self._broadcasted(x, reverse)
    if b.dtype == dtypes.bool: b, e = b.cast(dtypes.int8), e.cast(dtypes.int8)
    if not dtypes.is_float(b.dtype): return b._pow_int_tensor(e)
    zb, binf = b == 0, b.isinf()
    is_int = e == e.trunc()
    # the base the exp2/log2 form sees: 1 for 0 and +-inf (their values are constants below, with a 0 gradient to the
    # base, as torch gives for +-inf), the base itself where it is negative and e isn't an integer (log2 gives nan, so
    # value and gradient are nan, as torch), |b| otherwise (the sign is fixed up after)
    nan_base = (b < 0).logical_and(is_int.logical_not())
    r = (e * zb.logical_or(binf).where(1, nan_base.where(b, b.abs())).log2()).exp2()
    r = zb.where((e > 0).where(0.0, (e == 0).where(1.0, math.inf)), r)
    r = binf.where((e > 0).where(math.inf, (e == 0).where(1.0, 0.0)), r)  # C99: pow(-inf, 0.5) = inf
    # torch's base gradient e * b**(e-1) is inf where the form above has none (its base is the constant 1 there): at
    # b = +-0 for 0 < e < 1 and at b = +inf for e > 1. Branches that leave the value alone carry it: d sqrt(s*b) is inf
    # at 0 (s, the zero's sign, makes both zeros +inf, as torch), and d exp2(b) is inf at b = +inf, whose value is r's.
    z = zb.logical_and(e > 0).logical_and(e < 1)
    s = (b.reciprocal() < 0).where(-1.0, 1.0).cast(b.dtype)
    r = z.where(r + s * (s * z.where(b, 1.0)).sqrt(), r)
    pinf = (b == math.inf).logical_and(e > 1)
    r = pinf.where(pinf.where(b, 0.0).exp2(), r)
    half = e * 0.5
    odd = is_int.logical_and(half != half.trunc())
    neg = (b < 0).logical_or((b == 0).logical_and(b.reciprocal() < 0))  # -0.0 counts: (-0.0) ** -1 is -inf
    r = odd.logical_and(neg).where(-r, r)
    # cases the exp2/log2 form gets wrong (0 * inf or nan): x**0 = 1 for inf/nan x, 1**y = 1 for inf/nan y, (-1)**inf = 1
    one = (e == 0).logical_and(b.isinf().logical_or(b.isnan())).logical_or((b == 1).logical_and(e.isinf().logical_or(e.isnan())))
    one = one.logical_or((b == -1).logical_and(e.isinf()))
    return one.where(1, r)

  def __floordiv__(self, x): return self.floordiv(x)
  def __rfloordiv__(self, x): return self.floordiv(x, True)
  def __mod__(self, x): return self.mod(x)
  def __rmod__(self, x): return self.mod(x, True)
  def __pow__(self, x): return self.pow(x)
  def __rpow__(self, x): return self.pow(x, True)

  # ***** bitwise and logical *****
  def _bitop(self: Any, op: Ops, x: Any, reverse: bool, name: str) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    _need_int(a, name)
    return a._alu(op, b)

  def bitwise_and(self: Any, x: Any, reverse: bool = False) -> Tensor: return self._bitop(Ops.AND, x, reverse, "bitwise_and")
  def bitwise_or(self: Any, x: Any, reverse: bool = False) -> Tensor: return self._bitop(Ops.OR, x, reverse, "bitwise_or")
  def bitwise_xor(self: Any, x: Any, reverse: bool = False) -> Tensor: return self._bitop(Ops.XOR, x, reverse, "bitwise_xor")
  def xor(self: Any, x: Any, reverse: bool = False) -> Tensor: return self.bitwise_xor(x, reverse)
  def bitwise_not(self: Any) -> Tensor:
    _need_int(self, "bitwise_not")
    if self.dtype == dtypes.bool: return self.logical_not()
    return self._alu(Ops.XOR, self._const_like(dtypes.max(self.dtype) if dtypes.is_unsigned(self.dtype) else -1))

  def logical_and(self: Any, x: Any) -> Tensor: return self.bool()._bitop(Ops.AND, self._to_tensor(x).bool(), False, "logical_and")
  def logical_or(self: Any, x: Any) -> Tensor: return self.bool()._bitop(Ops.OR, self._to_tensor(x).bool(), False, "logical_or")
  def logical_xor(self: Any, x: Any) -> Tensor: return self.bool()._bitop(Ops.XOR, self._to_tensor(x).bool(), False, "logical_xor")

  def _shift(self: Any, op: Ops, x: Any, reverse: bool) -> Tensor:
    a, b = self._broadcasted(x, reverse)
    _need_int(a, "shift")
    if a.dtype == dtypes.bool:  # bool << 1 promotes to int; two bools have no shift (torch and tinygrad refuse too)
      raise TensorTypeError("shift is only defined for integer tensors (a bool operand needs an int one), got two bool operands")
    bits = a.dtype.itemsize * 8
    out = (b < 0).logical_or(b >= bits)
    over = (a < 0).where(-1, 0).cast(a.dtype) if op is Ops.SHR and not dtypes.is_unsigned(a.dtype) else a._const_like(0)
    return out.where(over, a._alu(op, out.where(0, b)))

  def lshift(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """Left shift of an int tensor (by an int or int tensor); shifting by >= the bit width gives 0. Float operands
    (a float Python scalar too) and two bools are a TensorTypeError (a RuntimeError, as in tinygrad and torch)."""
    return self._shift(Ops.SHL, x, reverse)
  def rshift(self: Any, x: Any, reverse: bool = False) -> Tensor:
    """Arithmetic right shift for signed ints, logical for unsigned; shifting by >= the bit width gives 0 or -1."""
    return self._shift(Ops.SHR, x, reverse)

  def __and__(self, x): return self.bitwise_and(x)
  def __rand__(self, x): return self.bitwise_and(x, True)
  def __or__(self, x): return self.bitwise_or(x)
  def __ror__(self, x): return self.bitwise_or(x, True)
  def __xor__(self, x): return self.bitwise_xor(x)
  def __rxor__(self, x): return self.bitwise_xor(x, True)
  def __invert__(self): return self.bitwise_not()
  def __lshift__(self, x): return self.lshift(x)
  def __rlshift__(self, x): return self.lshift(x, True)
  def __rshift__(self, x): return self.rshift(x)
  def __rrshift__(self, x): return self.rshift(x, True)

  # ***** simple unary *****
  def abs(self: Any) -> Tensor:
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool: return self
    if not dtypes.is_float(self.dtype): return (self < 0).where(-self, self)
    return (self == 0).where(0.0, (self < 0).where(-self, self))  # abs(-0.0) is 0.0, and the gradient at 0 is 0 (torch)
  def __abs__(self): return self.abs()
  def _abs_raw(self: Any) -> Tensor:
    """|x| with gradient +1 at 0: for odd functions built as sign(x) * f(|x|), whose slope at 0 must survive."""
    return (self < 0).where(-self, self)

  def sign(self: Any) -> Tensor:
    """-1, 0 or 1 in self's dtype; nan stays nan."""
    if self.dtype == dtypes.bool: return self
    ret = (self > 0).where(1, (self < 0).where(-1, 0)).cast(self.dtype)
    return self.isnan().where(self, ret) if dtypes.is_float(self.dtype) else ret

  def square(self: Any) -> Tensor: return self * self
  def reciprocal(self: Any) -> Tensor: return self._floated()._alu(Ops.RECIPROCAL)
  def rsqrt(self: Any) -> Tensor: return self.sqrt().reciprocal()

  def trunc(self: Any) -> Tensor: return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self
  def floor(self: Any) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (t > self).where(t - 1, t)
  def ceil(self: Any) -> Tensor:
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    return (t < self).where(t + 1, t)
  def round(self: Any) -> Tensor:
    """Round half to even, like numpy and torch."""
    if not dtypes.is_float(self.dtype): return self
    t = self.trunc()
    frac = (self - t).abs()
    odd = (t * 0.5).trunc() != t * 0.5
    up = (frac > 0.5).logical_or((frac == 0.5).logical_and(odd))
    return up.where(t + self.sign(), t)

  def isnan(self: Any) -> Tensor: return self != self if dtypes.is_float(self.dtype) else self._const_like(False, dtypes.bool)
  def isinf(self: Any, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    if not dtypes.is_float(self.dtype): return self._const_like(False, dtypes.bool)
    ret = self._const_like(False, dtypes.bool)
    if detect_positive: ret = ret.logical_or(self == math.inf)
    if detect_negative: ret = ret.logical_or(self == -math.inf)
    return ret
  def isfinite(self: Any) -> Tensor:
    if not dtypes.is_float(self.dtype): return self._const_like(True, dtypes.bool)
    return self.isinf().logical_or(self.isnan()).logical_not()

  def nan_to_num(self: Any, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """nan -> `nan`, +inf -> `posinf` (default: the dtype's largest finite value), -inf -> `neginf` (default: the smallest)."""
    if not dtypes.is_float(self.dtype): return self
    big = _float_max(self.dtype)
    x = self.isnan().where(nan, self)
    x = (self == math.inf).where(big if posinf is None else posinf, x)
    return (self == -math.inf).where(-big if neginf is None else neginf, x)

  # ***** min/max/clip/lerp *****
  def minimum(self: Any, x: Any) -> Tensor:
    """Elementwise minimum with broadcasting; a nan in either input gives nan (numpy)."""
    a, b = self._broadcasted(x)
    if a.dtype == dtypes.bool: return a.logical_and(b)
    if not dtypes.is_float(a.dtype): return (a < b).where(a, b)  # negation would wrap for unsigned and INT_MIN
    return -((-a).maximum(-b))  # MAX propagates nan and splits tie gradients evenly

  def clip(self: Any, min_: Any = None, max_: Any = None) -> Tensor:
    """Clamp to [min_, max_] (either may be None, not both); nan stays nan."""
    if min_ is None and max_ is None: raise TensorError("clip needs at least one of min_ and max_")
    x = self
    if min_ is not None:
      x, lo = x._broadcasted(min_)
      x = (x < lo).where(lo, x)
    if max_ is not None:
      x, hi = x._broadcasted(max_)
      x = (x > hi).where(hi, x)
    return x
  def clamp(self: Any, min_: Any = None, max_: Any = None) -> Tensor: return self.clip(min_, max_)

  def isclose(self: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """|self - other| <= atol + rtol * |other| elementwise (equal infinities are close; nan only with equal_nan)."""
    a, b = self._broadcasted(other)
    close = a == b
    if dtypes.is_float(a.dtype): close = close.logical_or(a.isfinite().logical_and(b.isfinite()).logical_and((a - b).abs() <= atol + rtol * b.abs()))
    elif rtol or atol: close = close.logical_or((a.cast(dtypes.float64) - b).abs() <= atol + rtol * b.cast(dtypes.float64).abs())
    return close.logical_or(a.isnan().logical_and(b.isnan())) if equal_nan else close

  def allclose(self: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element is close (isclose), as a Python bool (reads one value back)."""
    return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

  def copysign(self: Any, other: Any) -> Tensor:
    """|self| with the sign bit of `other` (-0.0 counts as negative), as a float. As torch: copysign(+-0, -1) is -0.0 and
    the gradient at self = 0 is 0; at self = +-inf it is +-1 (torch: nan; tinygrad and jax: +-1)."""
    a, b = self._broadcasted(other)
    a, b = a._floated(), b._floated()
    neg = (b < 0).logical_or((b == 0).logical_and(b.reciprocal() < 0))
    mag = a.abs()  # +0.0 for -0.0, slope 0 at 0
    return neg.where(-mag, mag)

  def fmod(self: Any, x: Any) -> Tensor:
    """C's fmod: the remainder of truncated division, with the sign of self (torch.fmod)."""
    a, b = self._broadcasted(x)
    if not dtypes.is_float(a.dtype): return a - a.div(b, rounding_mode="trunc") * b
    return (b.isinf().logical_and(a.isfinite())).where(a, a - (a / b).trunc() * b)

  def log10(self: Any) -> Tensor: return self.log2() * (math.log(2) / math.log(10))

  def logaddexp(self: Any, x: Any) -> Tensor:
    """log(exp(self) + exp(x)) without overflow: max + log1p(exp(-|self - x|)); -inf with -inf stays -inf."""
    a, b = self._broadcasted(x)
    a, b = a._floated(), b._floated()
    m = a.maximum(b)
    d = (a - b).abs()
    return (m == -math.inf).where(m, m + (-d.isnan().where(0.0, d)).exp()._log1p() + d.isnan().where(d, 0.0))

  def lerp(self: Any, end: Any, weight: Any) -> Tensor:
    """self + (end - self) * weight."""
    return self + (end - self) * weight

  # ***** transcendentals *****
  def _expm1(self: Any) -> Tensor:
    """exp(x) - 1 without cancellation near 0 (Taylor series for |x| < 0.5)."""
    x = self._floated()
    near = x.abs() < 0.5
    xs = near.where(x, 0.0)  # the polynomial only sees small inputs: no inf * 0 = nan in the masked branch's gradient
    small = _poly(xs, [1 / math.factorial(k) for k in range(10, 0, -1)]) * xs
    return near.where(small, x.exp() - 1)

  def _log1p(self: Any) -> Tensor:
    """log(1 + x) accurate near 0: log(u) * x / (u - 1) with u = 1 + x rounded (exact where u == 1)."""
    x = self._floated()
    u = x + 1
    d = u - 1
    return (d == 0).where(x, (u == math.inf).where(u, u.log() * (x / (d == 0).where(1, d))))

  def sin(self: Any) -> Tensor: return self._floated()._alu(Ops.SIN)
  def cos(self: Any) -> Tensor:
    """cos(x) = 1 - 2 sin(x/2)^2: halving is exact, so large |x| keeps ~1e-7 absolute accuracy."""
    s = (self._floated() * 0.5).sin()
    return 1 - 2 * s * s
  def tan(self: Any) -> Tensor: return self.sin() / self.cos()

  def _atan_unit(self: Any) -> Tensor:
    """atan on [0, 1]: atan(t) = pi/4 + atan((t-1)/(t+1)) above tan(pi/8), then an odd Taylor-like fit on |u| <= 0.415."""
    big = self > 0.41421356237309503
    u = big.where((self - 1) / (self + 1), self)
    z = u * u
    r = u + u * z * _poly(z, _ATAN_COEFFS)
    return big.where(r + math.pi / 4, r)

  def atan(self: Any) -> Tensor:
    x = self._floated()
    a = x._abs_raw()
    inv = a > 1
    r = inv.where(inv.where(a, 1).reciprocal(), a)._atan_unit()  # the masked branch stays finite: no nan gradient at 0
    r = inv.where(math.pi / 2 - r, r)
    return (x < 0).where(-r, r)

  def asin(self: Any) -> Tensor:
    """asin(x) = atan(x / sqrt((1 - x)(1 + x))), nan outside [-1, 1]."""
    x = self._floated()
    return (x / ((1 - x) * (1 + x)).sqrt()).atan()

  def acos(self: Any) -> Tensor:
    """acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): accurate near both ends, nan outside [-1, 1]."""
    x = self._floated()
    return 2 * ((1 - x) / (1 + x)).sqrt().atan()

  def sinh(self: Any) -> Tensor:
    x = self._floated()
    near = x.abs() < 1
    xs = near.where(x, 0.0)
    z = xs * xs
    small = xs + xs * z * _poly(z, [1 / 6227020800, 1 / 39916800, 1 / 362880, 1 / 5040, 1 / 120, 1 / 6])
    return near.where(small, (x.exp() - (-x).exp()) * 0.5)
  def cosh(self: Any) -> Tensor:
    x = self._floated()
    return (x.exp() + (-x).exp()) * 0.5
  def tanh(self: Any) -> Tensor:
    """tanh(x) = -expm1(-2|x|) / (2 + expm1(-2|x|)) with x's sign: no cancellation near 0, no overflow."""
    x = self._floated()
    m = (x._abs_raw() * -2)._expm1()
    r = -m / (m + 2)
    return (x < 0).where(-r, r)

  def asinh(self: Any) -> Tensor:
    x = self._floated()
    a = x._abs_raw()
    z = a * a
    r = (a + z / (1 + (z + 1).sqrt()))._log1p()
    r = (a > 1e18).where((a > 1e18).where(a, 1).log() + _LN2, r)
    return (x < 0).where(-r, r)
  def acosh(self: Any) -> Tensor:
    """log1p(d + sqrt(d) sqrt(x + 1)), d = x - 1, on [1, inf): accurate near 1 with an inf gradient at 1. Below 1 the
    value is nan and the gradient torch's 1 / sqrt(x**2 - 1) (from log(x + sqrt((x - 1)(x + 1))))."""
    x = self._floated()
    inside = x >= 1
    xi = inside.where(x, 2.0)  # each branch sees only its own inputs: the masked one can't leak a nan gradient
    d = xi - 1
    r = (d + d.sqrt() * (xi + 1).sqrt())._log1p()
    r = (xi > 1e18).where(xi.log() + _LN2, r)
    xo = inside.where(-2.0, x)
    return inside.where(r, (xo + ((xo - 1) * (xo + 1)).sqrt()).log())
  def atanh(self: Any) -> Tensor:
    """0.5 * (log1p(x) - log1p(-x)): accurate near 0, +-inf at +-1, nan outside; its gradient is 1 / (1 - x**2)
    everywhere (outside [-1, 1] too, as torch's)."""
    x = self._floated()
    small = x._abs_raw() < 0.5
    xs = small.where(x, 0.0)  # each branch sees only its own inputs: the masked one can't leak a nan gradient
    a = xs._abs_raw()
    r = (2 * a / (1 - a))._log1p() * 0.5
    r = (xs < 0).where(-r, r)
    xb = small.where(0.75, x)
    return small.where(r, ((1 + xb).log() - (1 - xb).log()) * 0.5)

  def erf(self: Any) -> Tensor:
    """Error function: Taylor series for |x| < 0.5, Abramowitz-Stegun 7.1.26 beyond (|error| < 2e-7)."""
    x = self._floated()
    a = x._abs_raw()
    near = a < 0.5
    xs = near.where(x, 0.0)  # each branch sees only its own inputs, so extreme x gives a 0 gradient, not nan
    small = xs * _poly(xs * xs, [c * 2 / math.sqrt(math.pi) for c in (-1 / 75600, 1 / 9360, -1 / 1320, 1 / 216, -1 / 42, 1 / 10, -1 / 3, 1)])
    ab = near.where(1.0, a.minimum(10.0))  # erf(10) is 1 in every float dtype: clamping keeps exp(-z) from underflowing to 0 * inf
    t = (ab * 0.3275911 + 1).reciprocal()
    big = 1 - t * _poly(t, [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592]) * (-ab * ab).exp()
    return near.where(small, (x < 0).where(-big, big))


def _float_max(dt: DType) -> float:
  e, m = dtypes.finfo(dt)
  if dt == dtypes.fp8e4m3: return 448.0
  return (2 - 2.0 ** -m) * 2.0 ** (2 ** (e - 1) - 1)


# atan(u) = u + u^3 * P(u^2) on |u| <= tan(pi/8): the Taylor series through u^17 (truncation error < 3e-9).
_ATAN_COEFFS: list[float] = [(-1) ** k / (2 * k + 1) for k in range(8, 0, -1)]
