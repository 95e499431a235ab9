"""Op conformance tests, one module per op group; each compares plugrad on the default device against numpy."""
