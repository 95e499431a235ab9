from plugrad.testing.ops.test_api_ops import *  # noqa: F403
