"""An OpenAI-compatible HTTP server on the standard library (http.server, one thread per connection).

Routes: POST /v1/chat/completions, POST /v1/completions (both with `stream` as server-sent events ending in
`data: [DONE]`), GET /v1/models, GET /health. One generation runs at a time (a lock; other requests wait their turn),
so the single KV cache is never shared. A streaming client that disconnects stops its generation at the next token.
Errors are OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from plugrad.apps.llm.generate import LLM, SamplingParams

MAX_BODY = 1 << 20   # bytes


class APIError(Exception):
  def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None, etype: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.code, self.param, self.etype = status, message, code, param, etype

  def body(self) -> dict: return {"error": {"message": self.message, "type": self.etype, "param": self.param, "code": self.code}}


def _num(req: dict, key: str, default: Any, kind: tuple = (int, float)) -> Any:
  v = req.get(key, default)
  if v is None: return default
  if isinstance(v, bool) or not isinstance(v, kind):
    raise APIError(400, f"'{key}' must be a {' or '.join(k.__name__ for k in kind)}, got {v!r}", param=key)
  return v


def sampling_from(req: dict, llm: LLM, n_prompt: int) -> SamplingParams:
  room = llm.gen.max_context - n_prompt
  max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
  max_tokens = room if max_tokens is None else _num({"max_tokens": max_tokens}, "max_tokens", None, (int,))
  stop = req.get("stop")
  stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
    raise APIError(400, f"'stop' must be a string or a list of up to 4 strings, got {req.get('stop')!r}", param="stop")
  p = SamplingParams(max_tokens=max_tokens, temperature=_num(req, "temperature", 0.8), top_p=_num(req, "top_p", 1.0),
                     top_k=_num(req, "top_k", 0, (int,)), seed=_num(req, "seed", None, (int,)), stop=[s for s in stop if s])
  try: p.check()
  except ValueError as e: raise APIError(400, str(e)) from None
  p.max_tokens = min(p.max_tokens, room)
  return p


class Server:
  def __init__(self, llm: LLM, api_key: str | None = None):
    self.llm, self.api_key, self.lock, self.created = llm, api_key, threading.Lock(), int(time.time())

  # ------------------------------------------------------------------ requests -> (status, json) or a stream
  def prepare(self, path: str, req: Any) -> tuple[list[int], SamplingParams, bool, bool]:
    if not isinstance(req, dict): raise APIError(400, "the request body must be a JSON object")
    chat = path == "/v1/chat/completions"
    llm = self.llm
    if chat:
      if "messages" not in req: raise APIError(400, "'messages' is required", param="messages")
      try: ids = llm.chat_prompt(req["messages"])
      except (TypeError, ValueError) as e: raise APIError(400, str(e), param="messages") from None
    else:
      prompt = req.get("prompt")
      if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str): prompt = prompt[0]
      if not isinstance(prompt, str) or not prompt: raise APIError(400, "'prompt' must be a non-empty string", param="prompt")
      ids = llm.completion_prompt(prompt)
    if len(ids) >= llm.gen.max_context:
      raise APIError(400, f"this model's maximum context length is {llm.gen.max_context} tokens, but the prompt has {len(ids)} "
                     "(and at least one token must be generated)", code="context_length_exceeded", param="messages" if chat else "prompt")
    stream = req.get("stream", False)
    if not isinstance(stream, bool): raise APIError(400, f"'stream' must be a boolean, got {stream!r}", param="stream")
    opts = req.get("stream_options") or {}
    if not isinstance(opts, dict): raise APIError(400, "'stream_options' must be an object", param="stream_options")
    return ids, sampling_from(req, llm, len(ids)), stream, bool(opts.get("include_usage", False))

  def usage(self) -> dict:
    u = self.llm.last_usage
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}

  def complete(self, chat: bool, ids: list[int], p: SamplingParams) -> dict:
    text = "".join(self.llm.stream(ids, p))
    cid, fr = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], self.llm.finish_reason
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": fr} if chat else \
             {"index": 0, "text": text, "logprobs": None, "finish_reason": fr}
    return {"id": cid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": self.llm.name, "choices": [choice], "usage": self.usage()}

  def chunks(self, chat: bool, ids: list[int], p: SamplingParams, include_usage: bool) -> Iterator[dict]:
    cid, created = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time())
    def chunk(piece: str | None, fr: str | None = None, role: bool = False) -> dict:
      if chat:
        delta = ({"role": "assistant", "content": ""} if role else {}) | ({"content": piece} if piece is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fr}
      else: choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": fr}
      return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created, "model": self.llm.name,
              "choices": [choice]}
    if chat: yield chunk(None, role=True)
    for piece in self.llm.stream(ids, p): yield chunk(piece)
    yield chunk(None, self.llm.finish_reason)
    if include_usage:
      yield {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created, "model": self.llm.name,
             "choices": [], "usage": self.usage()}


def make_handler(server: Server) -> type[BaseHTTPRequestHandler]:
  class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "plugrad-llm"

    def log_message(self, format: str, *args: Any) -> None: pass   # quiet

    def send_json(self, status: int, obj: dict) -> None:
      data = json.dumps(obj).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def authorized(self) -> bool:
      if server.api_key is None: return True
      if self.headers.get("Authorization", "") == f"Bearer {server.api_key}": return True
      self.send_json(401, APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key").body())
      return False

    def do_GET(self) -> None:
      path = self.path.split("?")[0]
      if path == "/health": return self.send_json(200, {"status": "ok"})
      if not self.authorized(): return
      if path == "/v1/models":
        model = {"id": server.llm.name, "object": "model", "created": server.created, "owned_by": "plugrad"}
        return self.send_json(200, {"object": "list", "data": [model]})
      self.send_json(404, APIError(404, f"unknown route: GET {path}", code="not_found").body())

    def do_POST(self) -> None:
      path = self.path.split("?")[0]
      try:
        try: length = int(self.headers.get("Content-Length") or 0)
        except ValueError: raise APIError(400, f"bad Content-Length header {self.headers.get('Content-Length')!r}") from None
        if length > MAX_BODY:
          self.close_connection = True
          raise APIError(413, f"request body of {length} bytes is larger than the {MAX_BODY}-byte limit", code="request_too_large")
        body = self.rfile.read(length) if length > 0 else b""
        if not self.authorized(): return
        if path not in ("/v1/chat/completions", "/v1/completions"): raise APIError(404, f"unknown route: POST {path}", code="not_found")
        try: req = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e: raise APIError(400, f"malformed JSON body: {e}") from None
        with server.lock:   # one generation at a time: others wait here
          ids, p, stream, usage = server.prepare(path, req)
          chat = path == "/v1/chat/completions"
          if not stream: return self.send_json(200, server.complete(chat, ids, p))
          self.send_response(200)
          self.send_header("Content-Type", "text/event-stream")
          self.send_header("Cache-Control", "no-cache")
          self.send_header("Connection", "close")
          self.end_headers()
          self.close_connection = True
          gen = server.chunks(chat, ids, p, usage)
          try:
            for c in gen:
              self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
              self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
          except (BrokenPipeError, ConnectionResetError): pass   # the client left: closing the generator stops generation
          finally: gen.close()
      except APIError as e: self.send_json(e.status, e.body())
      except (BrokenPipeError, ConnectionResetError): pass
      except Exception as e:  # a bug must not kill the server: report it as a 500
        self.send_json(500, APIError(500, f"internal error: {type(e).__name__}: {e}", etype="server_error").body())

  return Handler


def serve(llm: LLM, host: str = "127.0.0.1", port: int = 11434, api_key: str | None = None, ready: Any = None) -> None:
  httpd = ThreadingHTTPServer((host, port), make_handler(Server(llm, api_key)))
  httpd.daemon_threads = True
  print(f"serving {llm.name} on http://{host}:{httpd.server_address[1]}/v1 (OpenAI-compatible; Ctrl-C stops)", flush=True)
  if ready is not None: ready(httpd)
  try: httpd.serve_forever()
  except KeyboardInterrupt: pass
  finally: httpd.server_close()
