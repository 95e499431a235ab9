"""`python -m plugrad.apps.llm` as a user runs it, in subprocesses: it works without the server extra (only --serve
needs uvicorn and starlette), device selection errors and bad API keys are one line on stderr with exit status 2, and
--serve checks its port before loading the model (exit status 3, nothing claims to serve)."""
import os
import socket
import subprocess
import sys

import pytest

# runs the app with uvicorn, starlette and h11 unimportable, as on a machine without the `serve` extra
NO_SERVE_EXTRA = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("uvicorn", "starlette", "h11"): raise ImportError(f"No module named {name!r} (blocked by the test)")
    return None
sys.meta_path.insert(0, Block())
sys.argv = ["plugrad.apps.llm", *sys.argv[1:]]
runpy.run_module("plugrad.apps.llm", run_name="__main__", alter_sys=True)
"""


def run_app(*args: str, env: dict | None = None, no_serve_extra: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "-c", NO_SERVE_EXTRA, *args] if no_serve_extra else [sys.executable, "-m", "plugrad.apps.llm", *args]
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_help_and_prompt_without_the_serve_extra(tiny_gguf):
  r = run_app("--help", no_serve_extra=True)
  assert r.returncode == 0 and "--serve" in r.stdout, r.stderr
  r = run_app("-m", tiny_gguf, "--prompt", "hello", "--max_tokens", "3", no_serve_extra=True)
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
  r = run_app("-m", tiny_gguf, "--serve", "0", no_serve_extra=True)   # only the server needs the extra: it says how to get it
  assert r.returncode == 2 and r.stderr.startswith("error: the LLM server needs uvicorn and starlette") and "plugrad[serve]" in r.stderr
  assert "Traceback" not in r.stderr and "serving" not in r.stdout


def _unavailable(name: str) -> bool:
  from plugrad.device import Device
  try: entry = Device.entry(name)
  except Exception: return True
  return not entry.availability().ok


@pytest.mark.parametrize("dev", ["FOO", "CPUU", "AMD", "NV"])
def test_device_errors_are_one_line(tiny_gguf, dev):
  if dev in ("AMD", "NV") and not _unavailable(dev): pytest.skip(f"{dev} is available on this machine")
  r = run_app("-m", tiny_gguf, "--prompt", "hi", "--max_tokens", "2", env={"DEV": dev})
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: device '{dev}'"), r.stderr
  assert "Traceback" not in r.stderr and "plugrad-devices" in lines[0]


def test_device_errors_stay_exceptions_for_library_callers(tiny_gguf, monkeypatch):
  from plugrad.device import DeviceError
  code = f"from plugrad.apps.llm.generate import LLM\nLLM.load({tiny_gguf!r}, max_context=16)"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "DEV": "FOO"})
  assert r.returncode == 1 and "plugrad.device.DeviceNotFoundError" in r.stderr and issubclass(DeviceError, RuntimeError)


@pytest.mark.parametrize("how", ["flag", "file", "env"])
def test_a_key_no_client_can_send_is_refused_at_start(tiny_gguf, tmp_path, how):
  key = "sk-caf\u00e9"
  f = tmp_path / "key.txt"
  f.write_text(key + "\n", encoding="utf-8")
  args = {"flag": ["--api-key", key], "file": ["--api-key-file", str(f)], "env": []}[how]
  r = run_app("-m", tiny_gguf, "--serve", "0", *args, env={"PLUGRAD_API_KEY": key} if how == "env" else {"PLUGRAD_API_KEY": ""})
  assert r.returncode == 2 and "serving" not in r.stdout, (r.stdout, r.stderr)
  assert r.stderr.startswith("error: the API key has '\u00e9' at position 6") and "printable ASCII" in r.stderr, r.stderr


def test_api_key_check():
  pytest.importorskip("uvicorn")
  from plugrad.apps.llm.server import check_api_key
  assert check_api_key("sk-Abc_123.~+/=") == "sk-Abc_123.~+/="
  for bad in ("sk test", "sk-\u00e9", "sk-\x00", "tab\there", "sk-\u2603", ""):
    with pytest.raises(ValueError, match="API key"): check_api_key(bad)


def test_serve_on_a_taken_port_fails_before_loading(tiny_gguf, tmp_path):
  pytest.importorskip("uvicorn")
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # a model path that doesn't exist: the port is checked first, so the error is the port's
    r = run_app("-m", str(tmp_path / "missing.gguf"), "--serve", str(port))
    assert r.returncode == 3 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr == f"error: can't serve on 127.0.0.1:{port}: the address is already in use (another server on that port?)\n"
    r = run_app("-m", tiny_gguf, "--serve", str(port))   # a real model: not loaded, nothing claims to serve
    assert r.returncode == 3 and "serving" not in r.stdout and "loading" not in r.stderr and str(port) in r.stderr, (r.stdout, r.stderr)


def test_serve_port_out_of_range_is_a_usage_error(tiny_gguf):
  r = run_app("-m", tiny_gguf, "--serve", "70000")
  assert r.returncode == 2 and "--serve PORT must be in [0, 65535], got 70000" in r.stderr


def test_kv_dtype_option_and_a_bad_one(tiny_gguf):
  r = run_app("-m", tiny_gguf, "--prompt", "hi", "--max_tokens", "2", "--kv_dtype", "float32")
  assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
  r = run_app("-m", tiny_gguf, "--prompt", "hi", "--max_tokens", "2", "--kv_dtype", "int8")
  assert r.returncode == 2 and "argument --kv_dtype: invalid choice: 'int8'" in r.stderr, r.stderr
  r = run_app("-m", tiny_gguf, "--prompt", "hi", "--max_tokens", "2", env={"KV_DTYPE": "int8"})
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
  assert "error: KV_DTYPE must be one of ['float16', 'float32'], got 'int8'" in r.stderr, r.stderr
