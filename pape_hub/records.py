"""Result records: what an evaluation measured, as types instead of dicts.

An :class:`Evaluation` is one checkpoint swept across sizes: a :class:`SweepRow` per pass (a size, with or without
position interpolation, or with shuffled patches). In a comparison of encodings the same record also carries the
run's label, seed and training results. Every reader asks the record (:meth:`Evaluation.accuracy`,
:meth:`Evaluation.sizes`) instead of filtering rows itself. A checkpoint folder's card also shows where the
checkpoint stands among the comparison's seeds: that is a :class:`ComparisonContext`, written beside the evaluation
(``comparison.json``), never into it.

The JSON layout of ``eval.json`` and of a summary's ``runs`` is the records' ``to_dict()``; ``from_dict`` reads every
file written so far (older ones lack ``num_classes``; older checkpoint folders kept the comparison context inside
``eval.json``, which :func:`read_evaluation` still splits off).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["COMPARISON_FILE", "EVALUATION_FILE", "Comparison", "ComparisonContext", "Evaluation", "SweepRow",
           "git_commit", "read_evaluation"]

EVALUATION_FILE = "eval.json"
COMPARISON_FILE = "comparison.json"
PACKAGE = Path(__file__).resolve().parent


def git_commit() -> str:
    """The code version a record names: the short commit of the checkout (with ``+dirty`` for uncommitted changes
    to the package)."""
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=PACKAGE,
                                         stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(PACKAGE)], cwd=PACKAGE,
                               stderr=subprocess.DEVNULL).returncode
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@dataclass(frozen=True)
class SweepRow:
    """One pass over the test data at one size: accuracies, mean loss and the number of samples."""

    size: Any  # a grid size, pixels, or "FRAMESxSIZE" for clips
    interpolation: bool
    top1: float
    top5: float
    loss: float
    count: int
    patch_shuffle: bool = False

    def is_pass(self, size: Any, interpolation: bool = False, patch_shuffle: bool = False) -> bool:
        return self.size == size and self.interpolation == interpolation and self.patch_shuffle == patch_shuffle

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> SweepRow:
        return cls(row["size"], bool(row["interpolation"]), row["top1"], row["top5"], row["loss"], row["count"],
                   bool(row.get("patch_shuffle")))

    def to_dict(self) -> dict[str, Any]:
        head = dict(size=self.size, interpolation=self.interpolation)
        if self.patch_shuffle:
            head["patch_shuffle"] = True
        return dict(head, top1=self.top1, top5=self.top5, loss=self.loss, count=self.count)


#: the fields of an evaluation in the order its JSON has them
_FIELDS = ("checkpoint", "architecture", "encoding", "dataset", "num_classes", "split", "sweep_unit", "trained_at",
           "commit")


@dataclass
class Evaluation:
    """A checkpoint swept across sizes (``pape-hub eval``, the comparisons, ``train --push-to-hub``)."""

    rows: list[SweepRow] = field(default_factory=list)
    checkpoint: str | None = None
    architecture: str | None = None
    encoding: str | None = None  # the encoding, or in a comparison the run's label (e.g. "alibi[slope_scale=8]")
    dataset: str | None = None
    num_classes: int | None = None
    split: str | None = None
    sweep_unit: str | None = None  # what the sizes count, e.g. "grid" or "image size (px)"
    trained_at: Any = None  # the size the checkpoint was trained at
    commit: str | None = None
    seed: int | None = None  # in a comparison: the training seed
    train: dict[str, Any] | None = None  # in a comparison: what training returned (history, best epoch, test)

    def row(self, size: Any, interpolation: bool = False, patch_shuffle: bool = False) -> SweepRow | None:
        """The pass at ``size`` (with position interpolation / shuffled patches), or None if not swept."""
        return next((r for r in self.rows if r.is_pass(size, interpolation, patch_shuffle)), None)

    def accuracy(self, size: Any, interpolation: bool = False, patch_shuffle: bool = False) -> float | None:
        """Top-1 of that pass, or None if not swept."""
        row = self.row(size, interpolation, patch_shuffle)
        return row.top1 if row else None

    def sizes(self) -> list[Any]:
        """The sweep's sizes in its own order (passes with shuffled patches aside)."""
        return list(dict.fromkeys(r.size for r in self.rows if not r.patch_shuffle))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evaluation:
        return cls(rows=[SweepRow.from_dict(r) for r in data.get("rows", [])], seed=data.get("seed"),
                   train=data.get("train"), **{k: data.get(k) for k in _FIELDS})

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in _FIELDS if not (k == "num_classes" and self.num_classes is None)}
        out["rows"] = [r.to_dict() for r in self.rows]
        out.update({k: v for k, v in (("seed", self.seed), ("train", self.train)) if v is not None})
        return out


@dataclass
class ComparisonContext:
    """Where one checkpoint of a comparison stands: its encoding's columns over every seed (mean, std, min, max,
    n, ci95), the seeds, and the encodings' speed if measured. Its card shows these beside its own evaluation."""

    seeds: list[int]
    aggregate: dict[str, dict[str, Any]] | None = None
    bench: dict[str, Any] | None = None

    def write(self, folder: Path) -> Path:
        path = Path(folder) / COMPARISON_FILE
        path.write_text(json.dumps(dict(seeds=self.seeds, aggregate=self.aggregate, bench=self.bench), indent=2))
        return path


def read_evaluation(folder: str | Path) -> tuple[Evaluation | None, ComparisonContext | None]:
    """A checkpoint folder's evaluation and comparison context, each None where the folder has none."""
    folder = Path(folder)
    data = json.loads((folder / EVALUATION_FILE).read_text()) if (folder / EVALUATION_FILE).exists() else None
    context = json.loads((folder / COMPARISON_FILE).read_text()) if (folder / COMPARISON_FILE).exists() else None
    if data is not None and context is None and "seeds" in data:  # written before the context had its own file
        context = {k: data.get(k) for k in ("seeds", "aggregate", "bench")}
    return (Evaluation.from_dict(data) if data is not None else None,
            ComparisonContext(**context) if context else None)


#: a comparison's own fields, in the order ``summary.json`` has them after the facts
_COMPARISON_FIELDS = ("sizes", "unit", "seeds", "encodings", "failed", "aggregate", "runs", "hub", "wall_s", "title")


@dataclass
class Comparison:
    """Encodings trained over seeds and swept (``pape-hub arrows``, ``pape-hub compare``; ``summary.json``).

    ``facts`` say what was compared: the provenance first, then the task or dataset, model, recipe and budget, as
    the command records them. ``aggregate`` is each label's columns over seeds (mean, std, min, max, n, ci95);
    ``hub`` what publishing did; ``wall_s`` the run's wall time; ``title`` the plot's."""

    facts: dict[str, Any]
    sizes: list[Any]
    unit: str
    seeds: list[int]
    encodings: list[str]
    runs: list[Evaluation]
    aggregate: dict[str, dict[str, dict[str, Any]]]
    failed: list[str] = field(default_factory=list)
    hub: dict[str, Any] | None = None
    wall_s: int | None = None
    title: str | None = None

    @property
    def provenance(self) -> dict[str, Any]:
        return self.facts.get("provenance", {})

    def runs_of(self, encoding: str) -> list[Evaluation]:
        return [r for r in self.runs if r.encoding == encoding]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Comparison:
        fields = {k: data.get(k) for k in _COMPARISON_FIELDS}
        fields["runs"] = [Evaluation.from_dict(run) for run in data["runs"]]
        fields["failed"] = fields["failed"] or []
        return cls(facts={k: v for k, v in data.items() if k not in _COMPARISON_FIELDS}, **fields)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.facts)
        for key in _COMPARISON_FIELDS:
            value = getattr(self, key)
            if key == "runs":
                value = [r.to_dict() for r in value]
            if value is not None or key not in ("hub", "wall_s", "title"):
                out[key] = value
        return out
