"""The viewer: a starlette app over one loaded trace (viz/trace.py), served by uvicorn on 127.0.0.1.

Routes: `/` the page (static/index.html, app.js, style.css: no external resources), `/api/trace` the group list,
`/api/group/{g}` a group's rewrites and kernel (AST, optimizations, linear program, source), `/api/rewrite/{r}/{k}`
the graph after k steps of rewrite r as SVG with the nodes step k created highlighted, `/api/kernel/{g}/ast` a
kernel's AST graph, `/api/profile` the Chrome trace-event profile the timeline draws, `/api/waves` the launches with a
device instruction trace and `/api/waves/{k}` one of them (its waves, instructions and hot instructions: viz/waves.py).
"""
from __future__ import annotations

import functools
import socket
from pathlib import Path
from typing import Any

from plugrad.viz.capture import KernelTrace
from plugrad.viz.graph import NodeGraph, draw, replay
from plugrad.viz.waves import decode, launch_detail, launch_summary

STATIC = Path(__file__).parent / "static"


class Viewer:
  """The API's answers for one trace; graph drawings are cached."""
  def __init__(self, data: dict):
    self.data, self.graph = data, NodeGraph(data["nodes"])
    self.svg = functools.lru_cache(maxsize=512)(self._svg)
    self.saved_waves: list = data.get("waves") or []
    self.kernel_trace = functools.lru_cache(maxsize=64)(self._kernel_trace)

  def summary(self) -> dict:
    out = []
    for i, g in enumerate(self.data["groups"]):
      k = g.get("kernel")
      out.append({"id": i, "kind": g["kind"], "name": k["name"] if k else g["name"], "device": k["device"] if k else "",
                  "rewrites": len(g["rewrites"]), "steps": sum(len(self.data["rewrites"][r]["steps"]) for r in g["rewrites"])})
    return {"groups": out, "truncated": bool(self.data.get("truncated")), "profile": bool(self.data.get("profile", {}).get("traceEvents")),
            "waves": len(self.saved_waves)}

  def _kernel_trace(self, k: int) -> KernelTrace: return decode(self._get(self.saved_waves, k, "traced launch"), f"traced launch {k}")

  def waves(self) -> dict: return {"launches": [launch_summary(k, self.kernel_trace(k)) for k in range(len(self.saved_waves))]}

  def wave_launch(self, k: int) -> dict: return launch_detail(k, self.kernel_trace(k), self.saved_waves[k])

  def group(self, gid: int) -> dict:
    g = self._get(self.data["groups"], gid, "group")
    built = (g.get("kernel") or {}).get("built_by", [])
    rws = [{"id": r, "name": self.data["rewrites"][r]["name"], "steps": len(self.data["rewrites"][r]["steps"]), "schedule": r in built,
            "truncated": self.data["rewrites"][r]["truncated"]} for r in [*built, *g["rewrites"]]]
    return {"id": gid, "kind": g["kind"], "name": g["name"], "rewrites": rws, "kernel": g.get("kernel")}

  def _svg(self, root: int, changed: frozenset[int]) -> tuple[str, dict]: return draw(self.graph, root, set(changed))

  def rewrite(self, rid: int, k: int) -> dict:
    rw = self._get(self.data["rewrites"], rid, "rewrite")
    n = len(rw["steps"])
    if not 0 <= k <= n: raise KeyError(f"rewrite {rid} has steps 0..{n}, not {k}")
    root = replay(self.graph, rw, k)
    changed: frozenset[int] = frozenset()
    rule = None
    if k > 0:
      before = set(self.graph.toposort(replay(self.graph, rw, k - 1)))
      changed = frozenset(i for i in self.graph.toposort(root) if i not in before)
      ri, b, a = rw["steps"][k - 1]
      rule = {**self.data["rules"][ri], "before": self._row(b), "after": self._row(a)}
    svg, info = self.svg(root, changed)
    return {"id": rid, "name": rw["name"], "step": k, "steps": n, "rule": rule, "changed": len(changed), "svg": svg, **info,
            "truncated": rw["truncated"]}

  def kernel_ast(self, gid: int) -> dict:
    k = self._get(self.data["groups"], gid, "group").get("kernel")
    if not k: raise KeyError(f"group {gid} is not a kernel")
    svg, info = self.svg(k["ast"], frozenset())
    return {"svg": svg, **info}

  def _row(self, i: int) -> str:
    r = self.graph.rows[i]
    return f"%{i} {r[0]} {r[1]} {r[2][:120]}"

  @staticmethod
  def _get(xs: list, i: int, what: str) -> Any:
    if not 0 <= i < len(xs): raise KeyError(f"no {what} {i} (the trace has {len(xs)})")
    return xs[i]


def make_app(data: dict) -> Any:
  """The starlette application serving `data`."""
  try:
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
  except ImportError as e: raise ImportError(f"the VIZ viewer needs starlette and uvicorn: pip install 'plugrad[viz]' ({e})") from None
  v = Viewer(data)

  def api(fn):
    def endpoint(request):
      try: return JSONResponse(fn(*(int(x) for x in request.path_params.values())))
      except KeyError as e: return JSONResponse({"error": str(e.args[0])}, status_code=404)
      except Exception as e:  # e.g. graphviz's dot missing: the page shows the message
        msg = "graphviz's `dot` is not installed (apt install graphviz)" if type(e).__name__ == "ExecutableNotFound" else f"{type(e).__name__}: {e}"
        return JSONResponse({"error": msg}, status_code=500)
    return endpoint
  routes = [Route("/", lambda request: FileResponse(STATIC / "index.html")),
            Route("/api/trace", api(v.summary)), Route("/api/group/{g:int}", api(v.group)),
            Route("/api/rewrite/{r:int}/{k:int}", api(v.rewrite)), Route("/api/kernel/{g:int}/ast", api(v.kernel_ast)),
            Route("/api/profile", api(lambda: data.get("profile") or {"traceEvents": []})),
            Route("/api/waves", api(v.waves)), Route("/api/waves/{k:int}", api(v.wave_launch)),
            Mount("/static", StaticFiles(directory=STATIC))]
  return Starlette(routes=routes)


def serve(data: dict, host: str = "127.0.0.1", port: int = 8000) -> None:
  """Serve the viewer until interrupted (prints the URL first). Binds `host` only (127.0.0.1 unless asked)."""
  try: import uvicorn
  except ImportError as e: raise ImportError(f"the VIZ viewer needs starlette and uvicorn: pip install 'plugrad[viz]' ({e})") from None
  app = make_app(data)
  sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
  try:  # bound here, before the URL is printed, so a client that reads the URL can connect at once
    sock.bind((host, port))
    sock.listen(128)
  except OSError as e:
    sock.close()
    raise OSError(f"VIZ can't listen on {host}:{port} ({e.strerror}); set VIZ_PORT to a free port") from None
  print(f"VIZ: open http://{host}:{port}/ (Ctrl-C stops the server)", flush=True)
  with sock: uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
