"""The OpenAI-compatible server as a real subprocess on a free loopback port (a tiny random-weight GGUF): the openai
client (plain, streamed, completions, models), OpenAI-shaped errors, the API key, concurrent clients, disconnects."""
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

KEY = "sk-test-123"


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_gguf):
  port = free_port()
  proc = subprocess.Popen([sys.executable, "-m", "plugrad.apps.llm", "-m", tiny_gguf, "--serve", str(port), "--max_context", "64",
                           "--api-key", KEY], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "JIT": "1"})
  deadline = time.time() + 60
  while time.time() < deadline:
    if proc.poll() is not None: pytest.fail(f"server exited: {proc.stdout.read()}")
    try:
      if raw(port, "GET", "/health")[0] == 200: break
    except OSError: time.sleep(0.2)
  else: pytest.fail("server didn't start in 60 s")
  yield port
  proc.terminate()
  proc.wait(10)


def raw(port: int, method: str, path: str, body: bytes | str | None = None, key: str | None = KEY, headers: dict | None = None):
  c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
  h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
  c.request(method, path, body=body, headers=h)
  r = c.getresponse()
  data = r.read()
  c.close()
  return r.status, (json.loads(data) if data and r.getheader("Content-Type") == "application/json" else data)


def client(port):
  openai = pytest.importorskip("openai")
  return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=60)


MSGS = [{"role": "user", "content": "hello the world"}]


def test_openai_client_chat_stream_completions_models(server):
  c = client(server)
  r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, seed=5)
  assert r.object == "chat.completion" and r.choices[0].message.role == "assistant" and r.choices[0].finish_reason in ("stop", "length")
  assert isinstance(r.choices[0].message.content, str) and r.usage.prompt_tokens > 0
  assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
  again = c.chat.completions.create(model="tiny", messages=MSGS, max_completion_tokens=6, temperature=1.0, seed=5)
  assert again.choices[0].message.content == r.choices[0].message.content   # same seed, same answer (cache reuse included)
  chunks = list(c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=6, temperature=1.0, seed=5, stream=True,
                                          stream_options={"include_usage": True}))
  assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
  assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
  assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason
  comp = c.completions.create(model="tiny", prompt="the the", max_tokens=4, temperature=0)
  assert comp.object == "text_completion" and comp.usage.completion_tokens <= 4 and isinstance(comp.choices[0].text, str)
  assert [m.id for m in c.models.list().data] == ["tiny-llama"]


def test_errors_are_openai_shaped(server):
  openai = pytest.importorskip("openai")
  st, body = raw(server, "POST", "/v1/chat/completions", "{not json")
  assert st == 400 and "malformed JSON" in body["error"]["message"]
  st, body = raw(server, "POST", "/v1/chat/completions", json.dumps({"model": "x"}))
  assert st == 400 and body["error"]["param"] == "messages"
  st, body = raw(server, "POST", "/v1/chat/completions", json.dumps({"messages": MSGS, "temperature": "hot"}))
  assert st == 400 and body["error"]["param"] == "temperature"
  st, body = raw(server, "POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "the " * 80}]}))
  assert st == 400 and body["error"]["code"] == "context_length_exceeded" and "64" in body["error"]["message"]
  st, body = raw(server, "GET", "/v1/nothing")
  assert st == 404 and body["error"]["code"] == "not_found"
  with socket.create_connection(("127.0.0.1", server), timeout=30) as s:   # refused from the headers, before any body is read
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000000\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 413")
  st, body = raw(server, "GET", "/v1/models", key="wrong")
  assert st == 401 and body["error"]["code"] == "invalid_api_key"
  assert raw(server, "GET", "/health", key=None)[0] == 200
  with pytest.raises(openai.BadRequestError) as e:
    client(server).chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "hi"}])
  assert "role" in str(e.value)


def test_concurrent_clients_get_their_own_answers(server):
  def ask(seed):
    return raw(server, "POST", "/v1/chat/completions", json.dumps({"messages": MSGS, "max_tokens": 5, "temperature": 1.0, "seed": seed}))
  alone = {s: ask(s)[1]["choices"][0]["message"]["content"] for s in (1, 2, 3)}
  out: dict = {}
  ts = [threading.Thread(target=lambda s=s: out.__setitem__(s, ask(s))) for s in (1, 2, 3) for _ in range(2)]
  for t in ts: t.start()
  for t in ts: t.join(120)
  assert all(st == 200 for st, _ in out.values())
  assert {s: b["choices"][0]["message"]["content"] for s, (_, b) in out.items()} == alone


def test_client_disconnect_mid_stream(server):
  s = socket.create_connection(("127.0.0.1", server), timeout=30)
  body = json.dumps({"messages": MSGS, "max_tokens": 50, "stream": True, "temperature": 1.0, "seed": 1}).encode()
  s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
  got = b""
  while b"data: " not in got: got += s.recv(4096)
  s.close()   # gone after the first chunk: the server stops that generation and serves the next request
  st, body = raw(server, "POST", "/v1/chat/completions", json.dumps({"messages": MSGS, "max_tokens": 3, "temperature": 0}))
  assert st == 200 and body["usage"]["completion_tokens"] <= 3
