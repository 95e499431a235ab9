"""plugrad: a lazy tensor library whose programs are UOp graphs rewritten by one pattern engine."""
from plugrad.dtype import dtypes, DType  # noqa: F401
from plugrad.plugins.spec import PLUGIN_API_VERSION  # noqa: F401
from plugrad.device import Device, Buffer  # noqa: F401
from plugrad.tensor import Tensor  # noqa: F401
from plugrad.engine.jit import TinyJit  # noqa: F401
from plugrad.engine.function import function  # noqa: F401
from plugrad.uop.ops import UOp
from plugrad.viz import session as _viz_session  # noqa: F401  (VIZ=1 / PROFILE=1 exit hooks)


def Variable(name: str, min_val: int, max_val: int) -> UOp:
  """A symbolic integer with inclusive bounds (for shapes and JIT inputs); `.bind(value)` gives it a value."""
  return UOp.variable(name, min_val, max_val)
