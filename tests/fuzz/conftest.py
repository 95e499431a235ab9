"""Fuzzing settings: PLUGRAD_FUZZ_EXAMPLES cases per property (default 200: the `make test` size, deterministic);
`make fuzz` runs 10,000 per property with fresh randomness. Makes the folder's `fuzz_helpers` importable."""
import os
import sys
from pathlib import Path
from hypothesis import HealthCheck, settings

_here = str(Path(__file__).resolve().parent)
if _here not in sys.path: sys.path.insert(0, _here)

_n = int(os.environ.get("PLUGRAD_FUZZ_EXAMPLES", "200"))
settings.register_profile("plugrad-fuzz", max_examples=_n, deadline=None, database=None, derandomize=_n <= 200,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.load_profile("plugrad-fuzz")
