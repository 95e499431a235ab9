"""Makes the folder's `gradcheck` helper importable from the test modules (pytest runs with --import-mode=importlib)."""
import sys
from pathlib import Path

_here = str(Path(__file__).resolve().parent)
if _here not in sys.path: sys.path.insert(0, _here)
