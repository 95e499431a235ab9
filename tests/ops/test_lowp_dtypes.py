from plugrad.testing.ops.test_lowp_dtypes import *  # noqa: F403
