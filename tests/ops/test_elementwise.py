from plugrad.testing.ops.test_elementwise import *  # noqa: F403
