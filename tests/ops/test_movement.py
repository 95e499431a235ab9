from plugrad.testing.ops.test_movement import *  # noqa: F403
