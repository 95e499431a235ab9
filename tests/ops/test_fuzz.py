from plugrad.testing.ops.test_fuzz import *  # noqa: F401,F403
