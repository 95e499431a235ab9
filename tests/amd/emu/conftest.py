"""Make plugrad_amd importable from the source tree when the amd plugin is not installed in the venv."""
import sys
from pathlib import Path

try:
  import plugrad_amd  # noqa: F401
except ImportError:
  sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "plugins" / "amd"))
