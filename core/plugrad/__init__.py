"""plugrad: a lazy tensor library whose programs are UOp graphs rewritten by one pattern engine."""
from plugrad.dtype import dtypes, DType  # noqa: F401
from plugrad.plugins.spec import PLUGIN_API_VERSION  # noqa: F401
from plugrad.device import Device, Buffer  # noqa: F401
from plugrad.tensor import Tensor  # noqa: F401
from plugrad.engine.jit import TinyJit  # noqa: F401
