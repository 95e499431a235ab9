from plugrad.testing.ops.test_nn import *  # noqa: F403
