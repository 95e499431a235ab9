from plugrad.testing.ops.test_multi_jit import *  # noqa: F403
