"""Exit hooks: PROFILE=1 writes the Chrome trace (PROFILE_PATH); VIZ=1 saves the trace (VIZ_SAVE) or serves the viewer
on VIZ_HOST:VIZ_PORT (127.0.0.1:8000) until Ctrl-C. Installed by `import plugrad` when either flag is set."""
from __future__ import annotations

import atexit
import sys

from plugrad.helpers import getenv
from plugrad.viz import capture
from plugrad.viz.profile import write_chrome_trace
from plugrad.viz.server import serve
from plugrad.viz.trace import save, serialize

_installed = False


def at_exit() -> None:
  """What the flags ask for at exit; failures are reported, never raised (the program's own exit status stands)."""
  try:
    if capture.PROFILE:
      p = write_chrome_trace(getenv("PROFILE_PATH", "plugrad_profile.json"))
      print(f"PROFILE: {len(capture.TRACE.events)} events written to {p} (open in https://ui.perfetto.dev or chrome://tracing)", file=sys.stderr)
    if not capture.VIZ: return
    data = serialize()
    if (path := getenv("VIZ_SAVE", "")):
      print(f"VIZ: trace saved to {save(data, path)}; view it with: python -m plugrad.viz {path}", file=sys.stderr)
      return
    serve(data, getenv("VIZ_HOST", "127.0.0.1"), getenv("VIZ_PORT", 8000))
  except KeyboardInterrupt: pass
  except Exception as e: print(f"VIZ/PROFILE exit hook failed: {type(e).__name__}: {e}", file=sys.stderr)


def install() -> None:
  global _installed
  if (capture.VIZ or capture.PROFILE) and not _installed:
    atexit.register(at_exit)
    _installed = True


install()
