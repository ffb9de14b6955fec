"""Run a callback once a module has been imported: at once if it already is, else right after its code has run.

``import pape_hub`` registers the transformers face (its configs, models and processors with the Auto classes) this
way, when ``transformers`` itself is imported, so that timm users do not pay for importing transformers (two to
three seconds). The callback runs after the *top-level* ``transformers`` package has finished importing and before
the import statement that triggered it returns (``import transformers``, ``from transformers import pipeline``,
``import transformers.modeling_utils``): no transformers module is half-initialised at that point, so the face can
import whatever it needs. A failing callback becomes a warning: it must not break the user's import of the module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["when_imported"]


def when_imported(name: str, callback: Callable[[], None], failed: str = "") -> None:
    """Call ``callback()`` once top-level module ``name`` is imported (now, if it already is); ``failed``: what
    the warning adds when the callback raises (what is missing and how to see why)."""
    hook = (name, callback, failed)
    if name in sys.modules:
        _run(*hook)
    else:
        sys.meta_path.insert(0, _PostImportFinder(*hook))


def _run(name: str, callback: Callable[[], None], failed: str) -> None:
    try:
        callback()
    except Exception as err:  # noqa: BLE001 - the user's import of `name` must succeed whatever the hook does
        warnings.warn(f"pape_hub: the hook run after importing {name} failed ({type(err).__name__}: {err})"
                      + (f"; {failed}" if failed else ""), RuntimeWarning, stacklevel=3)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the other finders and wraps its loader; removes itself once used."""

    def __init__(self, name: str, callback: Callable[[], None], failed: str) -> None:
        self.name, self.callback, self.failed = name, callback, failed

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, self)
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    """The module's own loader, then the callback (once, with the finder removed first)."""

    def __init__(self, loader: importlib.abc.Loader, finder: _PostImportFinder) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
            _run(self.finder.name, self.finder.callback, self.finder.failed)
