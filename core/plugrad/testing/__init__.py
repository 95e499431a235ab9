"""plugrad.testing: the device-generic conformance suite.

Every Tensor op is checked against numpy on the device named by DEV (or the default device). Run it in the repo
with `DEV=X pytest tests/ops`, or from an installed plugrad with `DEV=X pytest --pyargs plugrad.testing` (the test
modules ship in the package `plugrad.testing.ops`; `helpers` has the harness: check_op, assert_close, rand_np,
TOLERANCE). On the slow PYTHON reference device skip the heavier tests with `-m "not slow"`.
"""
