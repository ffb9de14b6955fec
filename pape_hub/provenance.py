"""Where a measured number comes from: the commit, and a fingerprint of the code that can change it.

Every results JSON the project writes carries :func:`provenance`. The fingerprint hashes the package modules a
kind of result depends on (:data:`RESULT_SOURCES`) after parsing them and dropping docstrings, so comments and
documentation can change without invalidating a result, while any change to the code that computes it does.
``pape-hub report --check`` (and a test) compares each file under ``results/`` with the code it sits beside.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["RESULT_SOURCES", "code_fingerprint", "git_commit", "provenance"]

PACKAGE = Path(__file__).resolve().parent
_MODEL = ("encodings", "layers", "models")
_TRAINING = (*_MODEL, "data", "training.py", "evaluation.py", "checkpoint.py")
#: package paths (folders or files) whose code decides the numbers of each kind of result
RESULT_SOURCES: dict[str, tuple[str, ...]] = {
    "arrows": (*_TRAINING, "commands/arrows.py", "commands/compare.py"),
    "compare": (*_TRAINING, "commands/compare.py"),
    "bench": (*_MODEL, "commands/bench.py"),
    "profile": (*_MODEL, "commands/profile.py"),
}


def _normalised_source(path: Path) -> str:
    """The module's code without comments, formatting or docstrings."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_fingerprint(kind: str) -> str:
    """sha256 (16 hex digits) of the normalised sources behind results of ``kind``."""
    if kind not in RESULT_SOURCES:
        raise ValueError(f"unknown result kind {kind!r}; known: {sorted(RESULT_SOURCES)}")
    files: list[Path] = []
    for entry in RESULT_SOURCES[kind]:
        path = PACKAGE / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        if not file.exists():
            continue
        digest.update(str(file.relative_to(PACKAGE)).encode() + b"\0" + _normalised_source(file).encode() + b"\0")
    return digest.hexdigest()[:16]


def git_commit() -> str:
    """The short commit of the checkout (with ``+dirty`` for uncommitted changes to tracked files)."""
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=PACKAGE,
                                         stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(PACKAGE)], cwd=PACKAGE,
                               stderr=subprocess.DEVNULL).returncode
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(kind: str, argv: list[str] | None = None) -> dict[str, Any]:
    """What a results file records about the run that wrote it."""
    import timm
    import torch

    return dict(kind=kind, code_fingerprint=code_fingerprint(kind), commit=git_commit(),
                command="pape-hub " + " ".join(argv if argv is not None else sys.argv[1:]),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), python=platform.python_version(),
                torch=torch.__version__, timm=timm.__version__, machine=f"{platform.machine()}, "
                f"{torch.get_num_threads()} torch threads")
