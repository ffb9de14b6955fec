"""Make a saved model folder loadable with ``trust_remote_code=True`` where pape_hub is not installed.

transformers copies a model's code files and the files they import relatively (``from .x import y``, one flat
folder) from the model folder. This module writes the modeling file and every pape_hub module it depends on into
the folder, each as ``pape_hub_<package path>.py`` with its relative imports rewritten to those flat names. The
code is the package's own, copied at save time: there is one implementation, never a second one to keep in sync.
"""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

__all__ = ["ENTRY_MODULES", "record_auto_map", "write_remote_code"]

#: the files transformers is pointed at (``auto_map``), by their package module names; they keep their short names
ENTRY_MODULES = ("configuration_pape_vit", "modeling_pape_vit", "image_processing_pape_vit",
                 "configuration_pape_vivit", "modeling_pape_vivit", "video_processing_pape_vivit",
                 "configuration_pape_free_tokens", "modeling_pape_free_tokens")
_RELATIVE = re.compile(r"^(\s*)from (\.+)([\w.]*) import ", flags=re.MULTILINE)


def flat_name(module: str) -> str:
    """``pape_hub.encodings.base`` -> ``pape_hub_encodings_base``; the entry modules keep their short names."""
    last = module.rsplit(".", 1)[-1]
    return last if last in ENTRY_MODULES else module.replace(".", "_")


def resolve(module: str, dots: str, target: str) -> str:
    package = module.rsplit(".", len(dots))[0]  # one dot = the module's package, two = its parent, ...
    return f"{package}.{target}" if target else package


def _collect(module: str, seen: dict[str, str]) -> None:
    if module in seen:
        return
    path = Path(importlib.import_module(module).__file__)
    if path.name == "__init__.py":
        raise ValueError(f"remote code cannot import the package {module}; import its modules directly")
    source = path.read_text()
    seen[module] = source
    for _, dots, target in _RELATIVE.findall(source):
        _collect(resolve(module, dots, target), seen)


def write_remote_code(directory: str | Path, entries: list[str] | None = None) -> list[str]:
    """Write the entry modules (default: the image model's) and their dependencies into ``directory``; returns
    the file names."""
    entries = list(entries or ENTRY_MODULES[:3])
    directory = Path(directory)
    here = __name__.rsplit(".", 1)[0]  # pape_hub.hf, or the flat module folder of a remote copy
    if "." not in __name__ or not __name__.startswith("pape_hub."):
        # already a flat remote-code copy: its folder holds every file it needs
        names = []
        for file in Path(__file__).parent.glob("*.py"):
            if file.stem in ENTRY_MODULES or file.stem.startswith("pape_hub_") or file.stem == "remote_code":
                shutil.copyfile(file, directory / file.name)
                names.append(file.name)
        return sorted(names)
    sources: dict[str, str] = {}
    for entry in dict.fromkeys(entries):
        _collect(f"{here}.{entry}", sources)
    names = []
    for module, source in sources.items():
        def rewrite(match: re.Match, module: str = module) -> str:
            indent, dots, target = match.groups()
            return f"{indent}from .{flat_name(resolve(module, dots, target))} import "

        name = f"{flat_name(module)}.py"
        (directory / name).write_text(_RELATIVE.sub(rewrite, source))
        names.append(name)
    return sorted(names)


def record_auto_map(path: str | Path, auto_map: dict[str, str]) -> None:
    """Add ``auto_map`` to a saved processor config, so the folder loads with ``trust_remote_code=True`` where
    pape_hub is not installed."""
    import json

    path = Path(path)
    config = json.loads(path.read_text())
    config["auto_map"] = auto_map
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
