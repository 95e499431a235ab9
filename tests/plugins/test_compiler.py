"""Compiler base: on-disk cache keyed by identity and source, atomic writes, CompileError formatting."""
from __future__ import annotations
import pytest
from plugrad.device import CompileError, Compiler

class EchoCompiler(Compiler):
  def __init__(self, ident):
    super().__init__(ident)
    self.calls = 0
  def compile(self, src):
    self.calls += 1
    if "bad" in src: raise CompileError("echo failed", "line 2: bad token", src)
    return f"{self.cachekey}|{src}".encode()

def test_cache_miss_then_hit_across_instances(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  a, b = EchoCompiler("echo-1"), EchoCompiler("echo-1")
  assert a.compile_cached("k1") == b"echo-1|k1" and (a.calls, a.misses, a.hits) == (1, 1, 0)
  assert b.compile_cached("k1") == b"echo-1|k1" and (b.calls, b.hits) == (0, 1)
  assert a.cache_path("k1").is_relative_to(tmp_path / "compile") and a.cache_path("k1").exists()
  assert not list(a.cache_path("k1").parent.glob(".tmp-*"))  # temp files are renamed away

def test_cache_keyed_by_identity_and_source(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  a, b = EchoCompiler("echo-1"), EchoCompiler("echo-2 -O3")
  a.compile_cached("k"); a.compile_cached("k2")
  assert b.compile_cached("k") == b"echo-2 -O3|k" and b.calls == 1
  assert len({a.cache_path("k"), a.cache_path("k2"), b.cache_path("k")}) == 3

def test_cache_disabled(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
  c = EchoCompiler("e")
  c.compile_cached("k"); c.compile_cached("k")
  assert c.calls == 2 and not (tmp_path / "compile").exists()
  n = EchoCompiler(None)
  monkeypatch.delenv("DISABLE_COMPILER_CACHE")
  n.compile_cached("k"); n.compile_cached("k")
  assert n.calls == 2

def test_unwritable_cache_still_compiles(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("")
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "file"))  # a file, not a directory
  c = EchoCompiler("e")
  assert c.compile_cached("k") == b"e|k" and c.compile_cached("k") == b"e|k" and c.calls == 2

def test_compile_error_shows_log_and_source(tmp_path, monkeypatch):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  with pytest.raises(CompileError) as ei: EchoCompiler("e").compile_cached("int x;\nbad\n")
  s = str(ei.value)
  assert "echo failed" in s and "line 2: bad token" in s and "   2 | bad" in s
  assert not (tmp_path / "compile").exists() or not any((tmp_path / "compile").rglob("*"))
  assert ei.value.src_path is not None and open(ei.value.src_path).read() == "int x;\nbad\n"
  assert f"source written to {ei.value.src_path}" in s
  with pytest.raises(TypeError, match="must be str"): EchoCompiler("e").compile_cached(b"x")

def test_default_cache_dir(monkeypatch, tmp_path):
  from plugrad.helpers import cache_dir
  monkeypatch.delenv("PLUGRAD_CACHE_DIR")
  monkeypatch.setenv("HOME", str(tmp_path)); monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  assert cache_dir() == tmp_path / ".cache" / "plugrad"
