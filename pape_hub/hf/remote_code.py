"""Make a saved model folder loadable with ``trust_remote_code=True`` where pape_hub is not installed.

transformers copies a model's code files and the files they import relatively (``from .x import y``, one flat
folder) from the model folder, and warns once for every file that imports others. This module writes the entry files
transformers is pointed at (``auto_map``: the configuration, the models, the processors) under their own names, and
every pape_hub module they depend on into one more file, ``pape_hub_core.py``: the modules' own source, in the order
of their imports, with the imports between them dropped (each name is defined once: a check refuses a clash). So a
load reads two or three files and warns two or three times, as a native remote-code repository does. The code is the
package's own, copied at save time: there is one implementation, never a second one to keep in sync.
"""

from __future__ import annotations

import ast
import importlib
import re
import shutil
from pathlib import Path

__all__ = ["CORE_MODULE", "ENTRY_MODULES", "record_auto_map", "write_remote_code"]

#: the files transformers is pointed at (``auto_map``), by their package module names; they keep their short names
ENTRY_MODULES = ("configuration_pape_vit", "modeling_pape_vit", "image_processing_pape_vit",
                 "configuration_pape_vivit", "modeling_pape_vivit", "video_processing_pape_vivit",
                 "configuration_pape_free_tokens", "modeling_pape_free_tokens")
_RELATIVE = re.compile(r"^(\s*)from (\.+)([\w.]*) import ", flags=re.MULTILINE)
#: the one file that holds every pape_hub module the entry files depend on
CORE_MODULE = "pape_hub_core"


def flat_name(module: str, entries: list[str] | tuple[str, ...] = ENTRY_MODULES) -> str:
    """``pape_hub.hf.modeling_pape_vit`` -> ``modeling_pape_vit`` where it is one of ``entries`` (the files
    ``auto_map`` names keep their short names); any other module lives in :data:`CORE_MODULE`."""
    last = module.rsplit(".", 1)[-1]
    return last if last in entries else CORE_MODULE


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
            if file.stem in ENTRY_MODULES or file.stem == CORE_MODULE:
                shutil.copyfile(file, directory / file.name)
                names.append(file.name)
        return sorted(names)
    sources: dict[str, str] = {}
    for entry in dict.fromkeys(entries):
        _collect(f"{here}.{entry}", sources)
    names = []
    for module, source in sources.items():
        if flat_name(module, entries) == CORE_MODULE:
            continue

        def rewrite(match: re.Match, module: str = module) -> str:
            indent, dots, target = match.groups()
            return f"{indent}from .{flat_name(resolve(module, dots, target), entries)} import "

        name = f"{flat_name(module, entries)}.py"
        (directory / name).write_text(_RELATIVE.sub(rewrite, source))
        names.append(name)
    core = [m for m in _in_import_order(sources) if flat_name(m, entries) == CORE_MODULE]
    if core:
        (directory / f"{CORE_MODULE}.py").write_text(core_source(core, sources))
        names.append(f"{CORE_MODULE}.py")
    return sorted(names)


def _in_import_order(sources: dict[str, str]) -> list[str]:
    """The modules with each one after every module it imports relatively (a depth-first post-order)."""
    done: list[str] = []

    def visit(module: str) -> None:
        if module in done:
            return
        for _, dots, target in _RELATIVE.findall(sources[module]):
            dependency = resolve(module, dots, target)
            if dependency in sources and dependency != module and dependency not in done:
                visit(dependency)
        done.append(module)

    for module in sources:
        visit(module)
    return done


def core_source(modules: list[str], sources: dict[str, str]) -> str:
    """One module of ``modules`` (in import order): each one's source without its ``__future__`` import and its
    imports of the others (module-level, which a check confirms), under a line naming where it comes from. A
    top-level name defined by two of them would shadow one with the other: refused by name."""
    header = '"""The pape_hub modules this folder\'s code needs, copied at save time (pape_hub.hf.remote_code)."""'
    parts, defined = [header, "", "from __future__ import annotations", ""], {}
    for module in modules:
        tree = ast.parse(sources[module])
        drop: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "__future__"):
                if node not in tree.body:
                    raise ValueError(f"{module} imports {node.module or '.'} inside a function; remote code bundles "
                                     "module-level imports only")
                drop.update(range(node.lineno, node.end_lineno + 1))
        for node in tree.body:
            for name in _defined(node):
                if name != "__all__" and defined.setdefault(name, module) != module:
                    raise ValueError(f"{name} is defined by both {defined[name]} and {module}; remote code puts them "
                                     "in one module: rename one")
        lines = [line for i, line in enumerate(sources[module].splitlines(), 1) if i not in drop]
        parts += [f"# ---- {module} " + "-" * max(0, 100 - len(module)), *lines, ""]
    return "\n".join(parts) + "\n"


def _defined(node: ast.stmt) -> list[str]:
    """The top-level names a statement binds (definitions and assignments)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def record_auto_map(path: str | Path, auto_map: dict[str, str]) -> None:
    """Add ``auto_map`` to a saved processor config, so the folder loads with ``trust_remote_code=True`` where
    pape_hub is not installed."""
    import json

    path = Path(path)
    config = json.loads(path.read_text())
    config["auto_map"] = auto_map
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
