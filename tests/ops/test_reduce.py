from plugrad.testing.ops.test_reduce import *  # noqa: F403
