"""Generate ctypes bindings from C headers with ctypeslib2's clang2py, then make them load their libraries lazily.

  python autogen/generate.py nv            # regenerate plugins/nv/plugrad_nv/autogen/*.py from autogen/manifests/nv.json
  python autogen/generate.py nv --check    # regenerate into a temp folder and diff against the committed files
  python autogen/generate.py amd [--check] [--skip-slow]   # amd: kernel/ROCm/LLVM headers, registers from linux-source

Needs libclang (Debian `libclang1-19`) with the matching `clang==19.*` Python bindings and `ctypeslib2`; the header
wheels listed in the manifest (or a CUDA toolkit). clang2py exits 0 even when parsing fails, so every output is
checked: non-empty, importable without the library present, and exporting the manifest's expected symbols.
Manifest options per target (amd uses them): `kinds` (clang2py -k, default cdefstum), `clang_args`, `headers` (several
files into one module), `slow` (skipped by --skip-slow); per manifest: `include_links` (folder -> a symlink farm so
`#include <drm/drm.h>` finds libdrm's copy) and `tarball` (headers extracted from a source tarball at generation
time, named `tar:<path inside the tarball>`). Function-like macros whose body is a plain expression over their
arguments become Python functions; the others stay as comments.
Kernel-internal headers: `prelude` (C text included first: kernel type names and macros the header assumes; a name
picks the manifest's `preludes` entry). Targets with
`"kinds": "defines"` don't go through clang: the object- and function-like `#define`s named by `names`/`prefixes`/`suffixes` and
the members of the `enums` listed are read from the text (C integer suffixes and integer casts dropped, names defined
earlier in the same target allowed, `assume` supplies values the header takes from elsewhere, e.g. PAGE_SIZE), for
constants that live in .c files or in headers that can't be compiled on their own.
Post-processing: the stub library becomes `plugrad_nv.libload.LazyLibrary(label, names)` (loaded by name on the first
call), `#define a b` function aliases (cuMemAlloc -> cuMemAlloc_v2) become assignments, versioned exports
(__nvJitLinkCreate_13_0) get their public names, and machine-specific lines (include paths) are dropped.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = Path(__file__).resolve().parent / "manifests"


class GenerateError(RuntimeError):
  """A header could not be found or clang2py produced unusable output."""


def find_libclang(sonames: list[str]) -> str:
  if (p := os.environ.get("CLANG_LIBRARY_PATH")): return p
  dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"] + sorted(glob.glob("/usr/lib/llvm-*/lib"))
  for d in dirs:
    for s in sonames:
      if os.path.exists(os.path.join(d, s)): return os.path.join(d, s)
  raise GenerateError(f"libclang not found (looked for {sonames} in {dirs}); install it: apt-get install libclang1-19, or set CLANG_LIBRARY_PATH")


def header_dirs(spec: list[str]) -> list[str]:
  out = []
  for s in spec:
    if s.startswith("wheel:"): out += [os.path.join(p, s[6:]) for p in sys.path if p and os.path.isdir(os.path.join(p, s[6:]))]
    elif s.startswith("env:"):
      var, _, rest = s[4:].partition("/")
      if os.environ.get(var): out.append(os.path.join(os.environ[var], rest))
    else: out.append(s)
  return out


def find_header(name: str, dirs: list[str]) -> str:
  if os.path.isabs(name) and os.path.exists(name): return name
  for d in dirs:
    if os.path.exists(p := os.path.join(d, name)): return p
  raise GenerateError(f"header {name} not found in {dirs}; install the wheels in the manifest (pip install ...) or a CUDA toolkit")


def builtin_include_args() -> list[str]:
  """libclang1 ships without clang's resource headers (stddef.h): borrow gcc's."""
  return [f"-I{d}" for d in sorted(glob.glob("/usr/lib/gcc/*/*/include"))[-1:]]


def run_clang2py(header: str | list[str], out: str, kinds: str = "cdefstum", extra_args: list[str] | None = None) -> None:
  from ctypeslib import clang2py
  headers = [header] if isinstance(header, str) else header
  args = builtin_include_args() + [f"-I{os.path.dirname(headers[0])}"] + list(extra_args or [])
  argv = ["-k", kinds, "--clang-args", " ".join(args), *headers, "-o", out]
  try: rc = clang2py.main(argv)
  except SystemExit as e: rc = e.code
  if rc not in (0, None): raise GenerateError(f"clang2py {' '.join(argv)} exited with {rc}")


ALIAS = re.compile(r"^# (\w+) = (?:api \( )?(\w+)(?: \))? # macro$", re.M)


FN_MACRO = re.compile(r"^# def (\w+)\(([\w, ]*)\):  # macro\n#    return (.*?)  $", re.M)


def macro_functions(text: str) -> str:
  """Turn commented function-like macros into functions when the body is a Python expression over the arguments only."""
  import ast
  def repl(m: re.Match) -> str:
    name, args, body = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()], m.group(3).strip()
    try: tree = ast.parse(body, mode="eval")
    except SyntaxError: return m.group(0)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if calls or not names <= set(args) or any(isinstance(n, (ast.Compare, ast.BoolOp, ast.IfExp)) for n in ast.walk(tree)): return m.group(0)
    return f"def {name}({', '.join(args)}):  # macro\n    return {body}"
  return FN_MACRO.sub(repl, text)


def postprocess(text: str, name: str, lib: dict | None, header: str) -> str:
  lines = [ln for ln in text.splitlines() if not ln.startswith("# TARGET arch is:")]
  text = "\n".join(lines) + "\n"
  if lib is None:  # types and macros only (kernel uapi, packet and register headers): no library, no function stubs
    if "FIXME_STUB" in text: raise GenerateError(f"{name}: the header declares functions but the manifest names no library for them")
    text = macro_functions(text)
    return f"# Generated by autogen/generate.py from {os.path.basename(header)} (ctypeslib2 clang2py); do not edit.\n" + text
  stub_re = r"\nclass FunctionFactoryStub:.*?_libraries\['FIXME_STUB'\] = FunctionFactoryStub\(\) #  ctypes.CDLL\('FIXME_STUB'\)\n"
  stub = re.search(stub_re, text, re.S)
  if stub is None: raise GenerateError(f"{name}: clang2py output has no FIXME_STUB library block (ctypeslib2 version changed?)")
  lazy = (f"\nfrom plugrad_nv.libload import LazyLibrary\n_libraries = {{}}\n"
          f"_libraries['FIXME_STUB'] = LazyLibrary({lib['label']!r}, {tuple(lib['names'])!r}, {tuple(lib.get('preload', ()))!r})\n")
  text = text[:stub.start()] + lazy + text[stub.end():]
  text = text.replace("_libraries['FIXME_STUB']", f"_libraries[{lib['label']!r}]")
  defined = set(re.findall(r"^    (\w+) = _libraries\[", text, re.M))
  extra = [f"{a} = {b}" for a, b in ALIAS.findall(text) if b in defined and a not in defined]
  extra += [f"{m.group(1)} = {m.group(0)}" for f in sorted(defined) if (m := re.fullmatch(r"__(\w+?)_\d+_\d+", f))]
  head = f"# Generated by autogen/generate.py from {os.path.basename(header)} (ctypeslib2 clang2py); do not edit.\n"
  return head + text + ("\n# function aliases from #define and versioned exports\n" + "\n".join(extra) + "\n" if extra else "")


def check_output(path: str, expect: list[str], min_size: int = 1000) -> None:
  src = Path(path).read_text() if os.path.exists(path) else ""
  if len(src) < min_size or not src: raise GenerateError(f"{path}: clang2py produced {len(src)} bytes (header failed to parse?)")
  spec = importlib.util.spec_from_file_location(f"_autogen_check_{Path(path).stem}", path)
  mod = importlib.util.module_from_spec(spec)
  try: spec.loader.exec_module(mod)
  except Exception as e: raise GenerateError(f"{path} does not import: {type(e).__name__}: {e}") from e
  if (missing := [s for s in expect if not hasattr(mod, s)]): raise GenerateError(f"{path} lacks expected symbols {missing}")


def extract_tarball(spec: dict, members: list[str], dest: str) -> dict[str, str]:
  """Extract just `members` (paths below the tarball's top folder) from the source tarball; {member: extracted path}."""
  import tarfile
  if not os.path.exists(spec["path"]):
    raise GenerateError(f"{spec['path']} not found: apt-get install {spec['apt']} (the register and packet headers come from it)")
  top = spec["top"].rstrip("/") + "/"
  want = {top + m: m for m in members}
  out: dict[str, str] = {}
  with tarfile.open(spec["path"]) as tf:
    for ti in tf:
      if ti.name in want:
        tf.extract(ti, dest, filter="data")
        out[want[ti.name]] = os.path.join(dest, ti.name)
        if len(out) == len(want): break
  if (missing := sorted(set(members) - out.keys())): raise GenerateError(f"{spec['path']} lacks {missing}")
  return out


def link_farm(links: dict[str, str], dest: str) -> list[str]:
  """A folder of symlinks (`drm` -> /usr/include/libdrm) so headers' own #includes resolve; the -I flags for it."""
  if not links: return []
  for name, target in links.items():
    if not os.path.isdir(target): raise GenerateError(f"include folder {target} not found (needed as <{name}/...>)")
    os.symlink(target, os.path.join(dest, name))
  return [f"-I{dest}"]


def generate(target: str, out_dir: Path, skip_slow: bool = False) -> list[Path]:
  man = json.loads((MANIFESTS / f"{target}.json").read_text())
  lc = man["libclang"]
  os.environ["CLANG_LIBRARY_PATH"] = find_libclang(lc["sonames"])
  dirs = header_dirs(man["header_dirs"])
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  sys.path.insert(0, str(ROOT / "plugins" / target))  # so the check can import plugrad_nv.libload from the tree
  targets = {n: t for n, t in man["targets"].items() if not (skip_slow and t.get("slow"))}
  with tempfile.TemporaryDirectory() as work:
    tar_members = sorted({h[4:] for t in targets.values() for h in t.get("headers", [t.get("header")]) if h and h.startswith("tar:")})
    extracted = extract_tarball(man["tarball"], tar_members, work) if tar_members else {}
    os.mkdir(farm := os.path.join(work, "include_links"))
    link_args = link_farm(man.get("include_links", {}), farm)
    for name, t in targets.items():
      if isinstance(t.get("prelude"), str): t = {**t, "prelude": man["preludes"][t["prelude"]]}  # a named prelude of the manifest
      written.append(generate_one(name, t, out_dir, dirs, extracted, link_args))
  init = out_dir / "__init__.py"
  init.write_text(f'"""Generated ctypes bindings ({", ".join(man["targets"])}); regenerate with `make autogen`."""\n')
  return written + [init]


def generate_one(name: str, t: dict, out_dir: Path, dirs: list[str], extracted: dict[str, str], link_args: list[str]) -> Path:
  """Run clang2py for one manifest target, post-process and check its output; the written file."""
  headers = [extracted[h[4:]] if h.startswith("tar:") else find_header(h, dirs) for h in t.get("headers", [t.get("header")])]
  if t.get("kinds") == "defines": return write_defines(name, t, headers, out_dir)
  header = headers[0] if len(headers) == 1 else headers
  with tempfile.TemporaryDirectory() as d:
    raw = os.path.join(d, f"{name}.py")
    run_clang2py(header, raw, t.get("kinds", "cdefstum"), link_args + t.get("clang_args", []) + kernel_header_args(t, d))
    if not os.path.exists(raw) or os.path.getsize(raw) < 1000: raise GenerateError(f"clang2py produced no usable output for {header}")
    text = postprocess(Path(raw).read_text(), name, t.get("library"), ", ".join(os.path.basename(h) for h in headers))
  out = out_dir / f"{name}.py"
  out.write_text(text)
  check_output(str(out), t["expect"])
  names = ", ".join(os.path.basename(h) for h in headers)
  print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} from {names} ({len(text)} bytes)")
  return out


def kernel_header_args(t: dict, work: str) -> list[str]:
  """clang flags for a target's `prelude`: -include of a file holding it."""
  if not (pre := t.get("prelude")): return []
  Path(path := os.path.join(work, "prelude.h")).write_text("\n".join(pre) + "\n" if isinstance(pre, list) else pre)
  return ["-include", path]


C_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(?:\(([\w, ]*)\))?[ \t]+(.+)$", re.M)
C_ENUM = re.compile(r"\benum\s+(\w+)\s*\{(.*?)\}", re.S)
C_INT = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:[uU][lL]{0,2}|[lL]{1,2}[uU]?)\b")
C_CAST = re.compile(r"\(\s*(?:u?int(?:8|16|32|64)_t|u(?:8|16|32|64)|unsigned(?:\s+long)*(?:\s+int)?|long(?:\s+long)?)\s*\)")


def c_source(text: str) -> str:
  """Header text without comments and with continued lines joined."""
  text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
  text = re.sub(r"//[^\n]*", "", text)
  return text.replace("\\\n", " ")


def c_expression(body: str, known: set[str], args: list[str]) -> str | None:
  """A C integer expression as Python, or None when it isn't one (division, conditionals, logic, unknown names)."""
  import ast
  expr = re.sub(r"\s+", " ", C_CAST.sub("", C_INT.sub(r"\1", body.strip())))
  if not expr or any(tok in expr for tok in ("/", "?", "&&", "||", "\"", "'", "sizeof", "->", ".")) or re.search(r"!(?!=)", expr): return None
  try: tree = ast.parse(expr, mode="eval")
  except SyntaxError: return None
  for n in ast.walk(tree):
    if isinstance(n, ast.Name) and n.id not in known and n.id not in args: return None
    if isinstance(n, (ast.Compare, ast.BoolOp, ast.IfExp, ast.Attribute, ast.Subscript)): return None
    if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and n.func.id in known): return None
  return expr


def extract_defines(texts: list[str], t: dict) -> list[str]:
  """Python lines for the target's #defines (by `names`/`prefixes`) and `enums`, in source order."""
  names, prefixes, suffixes, enums = set(t.get("names", [])), tuple(t.get("prefixes", [])), tuple(t.get("suffixes", [])), set(t.get("enums", []))
  env: dict = {"__builtins__": {}, **t.get("assume", {})}  # the namespace checked expressions are evaluated in
  known, lines = set(t.get("assume", {})), [f"{k} = {v}  # assumed" for k, v in t.get("assume", {}).items()]
  found_enums: set[str] = set()
  def value(name: str, expr: str) -> None:
    v = eval(expr, env)  # an integer expression over earlier constants, checked by c_expression
    env[name] = v
    known.add(name)
    lines.append(f"{name} = {v:#x}" if v >= 0 else f"{name} = {v}")
  for text in map(c_source, texts):
    for m in C_ENUM.finditer(text):
      if m.group(1) not in enums: continue
      found_enums.add(m.group(1))
      nxt = 0
      for item in filter(None, (i.strip() for i in m.group(2).split(","))):
        member, _, e = item.partition("=")
        member = member.strip()
        expr = c_expression(e, known, []) if e.strip() else str(nxt)
        if expr is None: raise GenerateError(f"enum {m.group(1)}: member {member} = {e.strip()!r} is no integer expression")
        value(member, expr)
        nxt = env[member] + 1
    for m in C_DEFINE.finditer(text):
      name, params, body = m.group(1), m.group(2), m.group(3)
      if name not in names and not (prefixes and name.startswith(prefixes)) and not (suffixes and name.endswith(suffixes)) or name in known: continue
      args = [a.strip() for a in params.split(",") if a.strip()] if params is not None else []
      if (expr := c_expression(body, known, args)) is None:
        if name in names: raise GenerateError(f"#define {name} {body.strip()!r} is no integer expression")
        continue
      if params is None: value(name, expr)
      else:
        lines.append(f"def {name}({', '.join(args)}):\n  return {expr}")
        env[name] = eval(f"lambda {', '.join(args)}: {expr}", env)
        known.add(name)
  if (missing := sorted(names - known) + sorted(enums - found_enums)): raise GenerateError(f"{missing} not found")
  return lines


def write_defines(name: str, t: dict, headers: list[str], out_dir: Path) -> Path:
  """A `"kinds": "defines"` target: the constants as Python, checked like clang2py's output."""
  lines = extract_defines([Path(h).read_text(errors="replace") for h in headers], t)
  srcs = ", ".join(os.path.basename(h) for h in headers)
  text = f"# Generated by autogen/generate.py from {srcs} (#define and enum extraction); do not edit.\n" + "\n".join(lines) + "\n"
  out = out_dir / f"{name}.py"
  out.write_text(text)
  check_output(str(out), t["expect"], min_size=0)
  print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} from {srcs} ({len(lines)} names)")
  return out


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("target", help="manifest name in autogen/manifests (e.g. nv)")
  ap.add_argument("--check", action="store_true", help="regenerate into a temp folder and diff against the committed files")
  ap.add_argument("--skip-slow", action="store_true", help="leave out the manifest's slow targets (amd's register headers)")
  args = ap.parse_args(argv)
  man = json.loads((MANIFESTS / f"{args.target}.json").read_text())
  committed = ROOT / man["out_dir"]
  try:
    if not args.check:
      generate(args.target, committed, args.skip_slow)
      return 0
    with tempfile.TemporaryDirectory() as d:
      diffs = []
      for new in generate(args.target, Path(d), args.skip_slow):
        old = committed / new.name
        a = old.read_text().splitlines(keepends=True) if old.exists() else []
        diffs += difflib.unified_diff(a, new.read_text().splitlines(keepends=True), str(old), f"regenerated/{new.name}")
      if diffs:
        sys.stdout.writelines(diffs[:200])
        print(f"autogen check: committed bindings differ from regenerated ones ({len(diffs)} diff lines); run `make autogen`")
        return 1
      print("autogen check: committed bindings match")
      return 0
  except GenerateError as e:
    print(f"autogen: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__": sys.exit(main())
