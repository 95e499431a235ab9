from plugrad.testing.ops.test_linalg_rearrange import *  # noqa: F403
