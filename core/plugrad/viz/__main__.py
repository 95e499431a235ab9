"""`python -m plugrad.viz TRACE [--port N] [--host H]`: serve a trace saved with VIZ_SAVE (or a PROFILE_PATH profile)."""
from __future__ import annotations

import argparse
import sys

from plugrad.helpers import getenv
from plugrad.viz.server import serve
from plugrad.viz.trace import load


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m plugrad.viz", description="view a plugrad VIZ trace or PROFILE trace in the browser")
  ap.add_argument("trace", help="file written with VIZ=1 VIZ_SAVE=path, or a PROFILE_PATH Chrome trace")
  ap.add_argument("--port", type=int, default=getenv("VIZ_PORT", 8000), help="port (default $VIZ_PORT or 8000)")
  ap.add_argument("--host", default=getenv("VIZ_HOST", "127.0.0.1"), help="interface to bind (default 127.0.0.1: this machine only)")
  args = ap.parse_args(argv)
  try: data = load(args.trace)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try: serve(data, args.host, args.port)
  except (OSError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt: pass
  return 0


if __name__ == "__main__": sys.exit(main())
