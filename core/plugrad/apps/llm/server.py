"""The OpenAI-compatible HTTP server: a Starlette ASGI app served by uvicorn (h11), in front of the batching `Engine`.

Routes: POST /v1/chat/completions, POST /v1/completions (both with `stream` as server-sent events ending in
`data: [DONE]`), GET /v1/models, GET /health. The HTTP stack parses requests (chunked bodies, keep-alive, pipelining);
this module adds what a public endpoint needs on top: a deadline for a request's head and body, a body size limit,
errors shaped like OpenAI's {"error": {"message", "type", "param", "code"}} on every path (wrong method 405, unknown
route 404, malformed HTTP 400, bugs 500), an API key compared in constant time, and a shutdown that ends running
generations at once. Prompts are tokenized on worker threads, never on the engine's.
"""
from __future__ import annotations

import asyncio
import errno
import hmac
import json
import os
import socket
import time
import uuid
from typing import Any, AsyncIterator, Callable

from plugrad.apps.llm.engine import Engine, EngineError, Finished, Job
from plugrad.apps.llm.generate import LLM, SamplingParams

try:
  import h11
  import uvicorn
  from starlette.applications import Starlette
  from starlette.concurrency import run_in_threadpool
  from starlette.exceptions import HTTPException
  from starlette.requests import ClientDisconnect, Request
  from starlette.responses import JSONResponse, Response, StreamingResponse
  from starlette.routing import Route
  from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError as e:   # pragma: no cover - the serve extra isn't installed
  raise ImportError(f"the LLM server needs uvicorn and starlette: pip install 'plugrad[serve]' ({e})") from None

MAX_BODY = 1 << 20       # bytes of a request body
HEAD_TIMEOUT = 10.0      # default seconds for a request's line and headers to arrive (from the connection or the last response)
BODY_TIMEOUT = 30.0      # default seconds for its body (serve(request_timeout=t) makes these t and 3t)
KEEP_ALIVE = 5           # seconds an idle keep-alive connection stays open
MAX_HEADER_BYTES = 16 << 10
SEED_MAX = 1 << 64
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")


class APIError(Exception):
  def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None, etype: str = "invalid_request_error"):
    super().__init__(message)
    self.status, self.message, self.code, self.param, self.etype = status, message, code, param, etype

  def body(self) -> dict: return {"error": {"message": self.message, "type": self.etype, "param": self.param, "code": self.code}}

  def response(self, headers: dict | None = None) -> JSONResponse: return JSONResponse(self.body(), self.status, headers=headers)


def _error_bytes(status: int, message: str, code: str) -> bytes:
  return json.dumps(APIError(status, message, code).body()).encode()


def _num(req: dict, key: str, default: Any, kind: tuple = (int, float)) -> Any:
  v = req.get(key, default)
  if v is None: return default
  if isinstance(v, bool) or not isinstance(v, kind):
    raise APIError(400, f"'{key}' must be a {' or '.join(k.__name__ for k in kind)}, got {v!r}", param=key)
  return v


def sampling_from(req: dict, max_context: int, n_prompt: int) -> SamplingParams:
  """The sampling fields of a request body (OpenAI's names, plus top_k) checked into SamplingParams."""
  room = max_context - n_prompt
  max_tokens = req.get("max_completion_tokens", req.get("max_tokens"))
  max_tokens = room if max_tokens is None else _num({"max_tokens": max_tokens}, "max_tokens", None, (int,))
  stop = req.get("stop")
  stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
  if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
    raise APIError(400, f"'stop' must be a string or a list of up to 4 strings, got {req.get('stop')!r}", param="stop")
  seed = _num(req, "seed", None, (int,))
  if seed is not None and not 0 <= seed < SEED_MAX: raise APIError(400, f"'seed' must be in [0, 2**64), got {seed}", param="seed")
  p = SamplingParams(max_tokens=max_tokens, temperature=_num(req, "temperature", 0.8), top_p=_num(req, "top_p", 1.0),
                     top_k=_num(req, "top_k", 0, (int,)), seed=seed, stop=[s for s in stop if s])
  try: p.check()
  except ValueError as e: raise APIError(400, str(e), param=str(e).split()[0]) from None
  p.max_tokens = min(p.max_tokens, room)
  return p


class Server:
  """The routes' logic over an `LLM` (tokenizer, chat template) and an `Engine` (generation)."""

  def __init__(self, llm: LLM, engine: Engine, api_key: str | None = None):
    self.llm, self.engine, self.api_key, self.created = llm, engine, api_key, int(time.time())
    self.max_context = engine.max_context

  def authorize(self, request: Request) -> None:
    if self.api_key is None: return
    got = request.headers.get("authorization", "")
    if not hmac.compare_digest(got.encode("utf-8", "replace"), f"Bearer {self.api_key}".encode()):
      raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", code="invalid_api_key", etype="authentication_error")

  def prepare(self, chat: bool, req: Any) -> tuple[list[int], SamplingParams, bool, bool]:
    """Validate a request body and tokenize its prompt (on a worker thread): (ids, params, stream, include_usage)."""
    if not isinstance(req, dict): raise APIError(400, "the request body must be a JSON object")
    stream = req.get("stream", False)
    if not isinstance(stream, bool): raise APIError(400, f"'stream' must be a boolean, got {stream!r}", param="stream")
    opts = req.get("stream_options")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict): raise APIError(400, "'stream_options' must be an object", param="stream_options")
    n = req.get("n", 1)
    if n != 1 or isinstance(n, bool): raise APIError(400, f"only n=1 is supported, got {n!r}", param="n")
    sampling_from(req, self.max_context, 0)   # field errors before the (costlier) tokenization
    param = "messages" if chat else "prompt"
    try:
      if chat: ids = self.llm.chat_prompt(req.get("messages"), self.max_context)
      else: ids = self.llm.completion_prompt(self._prompt(req), self.max_context)
    except (TypeError, ValueError) as e:
      code = getattr(e, "code", None)
      raise APIError(400, str(e), code=code, param=param) from None
    if len(ids) >= self.max_context:
      raise APIError(400, f"this model's maximum context length is {self.max_context} tokens, but the prompt has {len(ids)} "
                     "(and at least one token must be generated)", code="context_length_exceeded", param=param)
    return ids, sampling_from(req, self.max_context, len(ids)), stream, bool(opts.get("include_usage", False))

  @staticmethod
  def _prompt(req: dict) -> str:
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str): prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt: raise APIError(400, "'prompt' must be a non-empty string", param="prompt")
    return prompt

  @staticmethod
  def usage(f: Finished) -> dict:
    return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens, "total_tokens": f.prompt_tokens + f.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": f.cached_tokens}}

  def completion(self, chat: bool, text: str, f: Finished) -> dict:
    fr = "stop" if f.reason == "cancelled" else f.reason
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": fr} if chat else \
             {"index": 0, "text": text, "logprobs": None, "finish_reason": fr}
    return {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": self.llm.name, "choices": [choice], "usage": self.usage(f)}

  async def chunks(self, chat: bool, job: Job, include_usage: bool) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed answer; closing this iterator (the client left) cancels the job."""
    cid, created = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    def event(choices: list, **extra: Any) -> bytes:
      ev = {"id": cid, "object": obj, "created": created, "model": self.llm.name, "choices": choices, **extra}
      return b"data: " + json.dumps(ev).encode() + b"\n\n"
    def choice(piece: str | None, fr: str | None = None, role: bool = False) -> dict:
      if not chat: return {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": fr}
      delta = ({"role": "assistant", "content": ""} if role else {}) | ({"content": piece} if piece is not None else {})
      return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fr}
    if chat: yield event([choice(None, role=True)])
    try:
      async for item in self.engine.run(job):
        if isinstance(item, Finished):
          yield event([choice(None, "stop" if item.reason == "cancelled" else item.reason)])
          if include_usage: yield event([], usage=self.usage(item))
        else: yield event([choice(item)])
    except EngineError as e:   # the headers are gone: report in the stream, as OpenAI does
      yield b"data: " + json.dumps(APIError(500, f"generation failed: {e}", etype="server_error").body()).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"

  async def complete(self, request: Request, chat: bool, job: Job) -> Response:
    """Run a non-streamed job while watching for the client to disconnect (which cancels it)."""
    async def collect() -> tuple[str, Finished]:
      parts = []
      async for item in self.engine.run(job):
        if isinstance(item, Finished): return "".join(parts), item
        parts.append(item)
      raise EngineError("the engine ended the request without finishing it")
    async def gone() -> None:
      while (await request.receive())["type"] != "http.disconnect": pass
    work, watch = asyncio.ensure_future(collect()), asyncio.ensure_future(gone())
    try:
      done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
      if work not in done:   # the client left: stop generating for it
        work.cancel()
        self.engine.cancel(job)
        return Response(status_code=499)
      try: text, fin = work.result()
      except EngineError as e: raise APIError(500, f"generation failed: {e}", etype="server_error") from None
      return JSONResponse(self.completion(chat, text, fin))
    finally:
      watch.cancel()
      if not work.done(): work.cancel()

  # ------------------------------------------------------------------ routes
  async def generate(self, request: Request) -> Response:
    self.authorize(request)
    chat = request.url.path == "/v1/chat/completions"
    req = await read_json(request)
    ids, p, stream, include_usage = await run_in_threadpool(self.prepare, chat, req)
    job = Job(ids, p, asyncio.get_running_loop())
    if stream:
      return StreamingResponse(self.chunks(chat, job, include_usage), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await self.complete(request, chat, job)

  async def models(self, request: Request) -> Response:
    self.authorize(request)
    return JSONResponse({"object": "list", "data": [{"id": self.llm.name, "object": "model", "created": self.created, "owned_by": "plugrad"}]})

  async def health(self, request: Request) -> Response:
    busy = sum(s.job is not None for s in self.engine.slots)
    return JSONResponse({"status": "ok", "slots": len(self.engine.slots), "slots_busy": busy, "waiting": len(self.engine.waiting)})


MAX_INT_DIGITS = 4300   # Python's own limit on int() of a decimal string (sys.get_int_max_str_digits' default)


class ClientGone(Exception):
  """The client closed its connection before its request was read: nobody is left to answer (handled quietly)."""


def _parse_int(s: str) -> int:
  if len(s.lstrip("-")) > MAX_INT_DIGITS:
    raise APIError(400, f"malformed JSON body: a number has {len(s.lstrip('-'))} digits (at most {MAX_INT_DIGITS} are accepted)")
  return int(s)


async def read_json(request: Request) -> Any:
  """The request body parsed as JSON: 413 past MAX_BODY (from Content-Length before reading, or while reading a chunked
  body), 408 when it doesn't arrive within BODY_TIMEOUT, 400 when it isn't JSON (nesting too deep and integers of more
  than MAX_INT_DIGITS digits included); ClientGone when the client leaves before sending all of it."""
  cl = request.headers.get("content-length")
  if cl is not None and cl.isdigit() and int(cl) > MAX_BODY:
    raise APIError(413, f"request body of {cl} bytes is larger than the {MAX_BODY}-byte limit", code="request_too_large")
  async def read() -> bytes:
    body = bytearray()
    async for chunk in request.stream():
      body += chunk
      if len(body) > MAX_BODY: raise APIError(413, f"request body is larger than the {MAX_BODY}-byte limit", code="request_too_large")
    return bytes(body)
  try: body = await asyncio.wait_for(read(), BODY_TIMEOUT)
  except asyncio.TimeoutError: raise APIError(408, f"the request body didn't arrive within {BODY_TIMEOUT:g} s", code="request_timeout") from None
  except ClientDisconnect: raise ClientGone() from None
  try: return json.loads(body, parse_int=_parse_int)
  except (json.JSONDecodeError, UnicodeDecodeError) as e: raise APIError(400, f"malformed JSON body: {e}") from None
  except RecursionError: raise APIError(400, "malformed JSON body: nested too deeply") from None


def build_app(server: Server) -> Starlette:
  """The ASGI app: routes, and exception handlers that turn every error into an OpenAI-shaped JSON body."""
  async def api_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, APIError)
    return e.response({"Connection": "close"} if e.status in (408, 413) else None)
  async def http_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, HTTPException)
    if e.status_code == 405:
      return APIError(405, f"method {request.method} is not allowed on {request.url.path}", code="method_not_allowed").response(e.headers)
    if e.status_code == 404:
      path = request.url.path
      hint = f" (routes have no trailing slash: {path.rstrip('/')})" if path.endswith("/") and path.rstrip("/") in ROUTES else ""
      return APIError(404, f"unknown route: {request.method} {path}{hint}", code="not_found").response()
    return APIError(e.status_code, str(e.detail), etype="invalid_request_error").response(e.headers)
  async def server_error(request: Request, e: Exception) -> Response:   # a bug must not kill the server, nor show a page
    return APIError(500, f"internal error: {type(e).__name__}: {e}", etype="server_error").response()
  async def client_gone(request: Request, e: Exception) -> Response:   # nobody reads it (uvicorn drops sends after a disconnect)
    return Response(status_code=499)
  routes = [Route("/v1/chat/completions", server.generate, methods=["POST"]), Route("/v1/completions", server.generate, methods=["POST"]),
            Route("/v1/models", server.models, methods=["GET"]), Route("/health", server.health, methods=["GET"])]
  app = Starlette(routes=routes, exception_handlers={APIError: api_error, HTTPException: http_error, ClientGone: client_gone,
                                                     Exception: server_error})
  app.router.redirect_slashes = False   # its redirect would build a Location from the client's Host header: a 404 instead
  return app


class Protocol(H11Protocol):
  """uvicorn's h11 protocol with a deadline for each request head (a client that opens a connection, or keeps one alive,
  and sends its headers slowly is dropped after HEAD_TIMEOUT) and a JSON body on the 400 for malformed HTTP."""

  def connection_made(self, transport: Any) -> None:
    super().connection_made(transport)
    self._arm_head_timer()

  def _arm_head_timer(self) -> None:
    self._head_cycle = self.cycle
    self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_timeout)

  def _head_timeout(self) -> None:
    if self.cycle is self._head_cycle and not self.transport.is_closing() and not self._busy():
      if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:   # nothing sent yet: say why
        msg = f"the request head didn't arrive within {HEAD_TIMEOUT:g} s"
        try: self.transport.write(self._raw_response(408, _error_bytes(408, msg, "request_timeout")))
        except Exception: pass
      self.transport.close()

  def _busy(self) -> bool: return self.cycle is not None and not self.cycle.response_complete

  def data_received(self, data: bytes) -> None:
    super().data_received(data)
    if self.cycle is not self._head_cycle: self._head_timer.cancel()

  def on_response_complete(self) -> None:
    super().on_response_complete()
    self._head_timer.cancel()
    if not self.transport.is_closing(): self._arm_head_timer()

  def connection_lost(self, exc: Exception | None) -> None:
    self._head_timer.cancel()
    super().connection_lost(exc)

  @staticmethod
  def _raw_response(status: int, body: bytes) -> bytes:
    reason = {400: b"Bad Request", 408: b"Request Timeout"}[status]
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
    return head % (status, reason, len(body)) + body

  def send_400_response(self, msg: str) -> None:
    self.transport.write(self._raw_response(400, _error_bytes(400, f"malformed HTTP request: {msg}", "bad_http_request")))
    self.transport.close()


class _Uvicorn(uvicorn.Server):
  """Stops the engine as soon as a shutdown is asked for, so open streams end and the shutdown takes well under a second."""
  def __init__(self, config: uvicorn.Config, engine: Engine):
    super().__init__(config)
    self.engine = engine

  def handle_exit(self, sig: int, frame: Any) -> None:
    super().handle_exit(sig, frame)
    self.engine.shutdown(0)


def check_api_key(key: str) -> str:
  """`key` when a client can send it: printable ASCII without spaces (HTTP header values are bytes whose non-ASCII
  decoding differs between clients), else a ValueError naming the first character that isn't."""
  if not key: raise ValueError("the API key is empty")
  bad = next(((i, c) for i, c in enumerate(key) if not "!" <= c <= "~"), None)
  if bad is not None:
    raise ValueError(f"the API key has {bad[1]!r} at position {bad[0]}: a key must be printable ASCII without spaces "
                     "(letters, digits and punctuation), which every HTTP client sends alike")
  return key


def resolve_api_key(key: str | None, key_file: str | None) -> str | None:
  """The API key: --api-key, else the first line of --api-key-file, else $PLUGRAD_API_KEY, else none; a key a client
  couldn't send (`check_api_key`) is a ValueError."""
  if key: return check_api_key(key)
  if key_file:
    with open(key_file, encoding="utf-8", errors="replace") as f: key = f.readline().strip()
    if not key: raise ValueError(f"the API key file {key_file} is empty")
    try: return check_api_key(key)
    except ValueError as e: raise ValueError(f"{e} (read from {key_file})") from None
  if (env := os.environ.get("PLUGRAD_API_KEY")):
    try: return check_api_key(env)
    except ValueError as e: raise ValueError(f"{e} (read from PLUGRAD_API_KEY)") from None
  return None


class BindError(OSError):
  """The server's address can't be bound (in use, not this machine's, a port out of range, no permission)."""


def bind_socket(host: str, port: int) -> socket.socket:
  """A TCP socket bound to (host, port), not yet listening (uvicorn listens when it starts serving, so clients that
  come earlier are refused rather than queued). Raises BindError naming the address and the reason."""
  if not 0 <= port <= 65535: raise BindError(f"can't serve on port {port}: a port is a number from 0 to 65535")
  try: infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
  except (socket.gaierror, UnicodeError) as e: raise BindError(f"can't serve on {host}:{port}: unknown host ({e})") from None
  family, stype, proto, _, addr = infos[0]
  sock = socket.socket(family, stype, proto)
  try:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does: a restart reuses a port in TIME_WAIT
    sock.bind(addr)
  except OSError as e:
    sock.close()
    why = "the address is already in use (another server on that port?)" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
    raise BindError(f"can't serve on {host}:{port}: {why}") from None
  sock.set_inheritable(True)
  return sock


def serve(llm: LLM, host: str = "127.0.0.1", port: int = 11434, api_key: str | None = None, prefill_chunk: int = 128,
          request_timeout: float = HEAD_TIMEOUT, ready: Callable[[Any], None] | None = None, sock: socket.socket | None = None) -> None:
  """Serve `llm` until SIGINT/SIGTERM on `sock` (a `bind_socket`), else on (host, port) bound now (BindError if it can't be)."""
  global HEAD_TIMEOUT, BODY_TIMEOUT
  if api_key is not None: check_api_key(api_key)
  if sock is None: sock = bind_socket(host, port)
  HEAD_TIMEOUT, BODY_TIMEOUT = request_timeout, 3 * request_timeout
  backend = llm.backend()
  backend.warm_up()   # before announcing: the first (concurrent) requests must not pay compilation and JIT capture
  engine = Engine(backend, llm.tok, prefill_chunk=prefill_chunk)
  app = build_app(Server(llm, engine, api_key))
  config = uvicorn.Config(app, http=Protocol, lifespan="off", log_level="warning", access_log=False,
                          timeout_keep_alive=KEEP_ALIVE, timeout_graceful_shutdown=0.5,  # type: ignore[arg-type]  # a float works: asyncio.wait_for
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                          server_header=False)
  server = _Uvicorn(config, engine)
  shost, sport = sock.getsockname()[:2]
  url = f"http://[{shost}]:{sport}/v1" if ":" in shost else f"http://{shost}:{sport}/v1"
  print(f"serving {llm.name} on {url} ({engine.backend.slots} slots; OpenAI-compatible; Ctrl-C stops)", flush=True)
  if ready is not None: ready(server)
  try: server.run(sockets=[sock])
  finally:
    engine.shutdown(0.5)
    sock.close()
