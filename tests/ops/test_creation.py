from plugrad.testing.ops.test_creation import *  # noqa: F403
