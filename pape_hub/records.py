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
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["COMPARISON_FILE", "EVALUATION_FILE", "Comparison", "ComparisonContext", "Evaluation", "SweepRow",
           "chance_interval", "describe_spec", "field_value", "git_commit", "read_evaluation", "read_record"]

EVALUATION_FILE = "eval.json"
COMPARISON_FILE = "comparison.json"
PACKAGE = Path(__file__).resolve().parent


def git_commit() -> str:
    """The code version a record names: the short commit of pape_hub's own checkout (with ``+dirty`` for
    uncommitted changes to the package); an installed package, even one inside the user's own git project, names
    its version instead (the user's commit says nothing about pape_hub's code)."""
    checkout = PACKAGE.parent
    try:
        own = (checkout / ".git").exists() and 'name = "pape_hub"' in (checkout / "pyproject.toml").read_text()
    except OSError:
        own = False
    if not own:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"pape_hub {version('pape_hub')}"
        except PackageNotFoundError:
            return "unknown"
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=PACKAGE,
                                         stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(PACKAGE)], cwd=PACKAGE,
                               stderr=subprocess.DEVNULL).returncode
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe_spec(spec: str) -> str:
    """The spec as recorded in checkpoints and cards: a local path is reduced to its folder name (an absolute path
    says nothing to another machine and may say too much about this one)."""
    kind, _, arg = spec.partition(":")
    if kind in ("imagefolder", "cifar", "videofolder"):
        return f"{kind}:{Path(arg.rstrip('/')).name}"
    if kind == "hf" and arg and Path(arg).exists():  # a save_to_disk folder: not a Hub id, so not written as one
        return f"hf-disk:{Path(arg.rstrip('/')).name}"
    return spec


_NUMBER, _TEXT, _SIZE = (int, float), (str, type(None)), (int, str)


def field_value(data: Any, key: str, kinds: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    """``data[key]``, checked to be of ``kinds`` (a bool is no number), or one error naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(data).__name__}")
    if key not in data:
        if default is not ...:
            return default
        raise ValueError(f"{where}.{key} is missing")
    value = data[key]
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ValueError(f"{where}.{key} must be {names}, got {json.dumps(value)[:60]}")
    return value


def list_of(data: Any, key: str, kinds: type | tuple[type, ...], where: str, default: Any = ...) -> list[Any]:
    """``data[key]``, a JSON list whose every item is of ``kinds``."""
    items = field_value(data, key, list, where, default)
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    for i, item in enumerate(items or []):
        if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{where}.{key}[{i}] must be {names}, got {json.dumps(item)[:60]}")
    return items


def read_record(path: str | Path, parse: Any) -> Any:
    """A results file parsed by ``parse`` (a record's ``from_dict``): a file that is no JSON, or a field of the
    wrong kind, is one error naming the file and the field."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    try:
        return parse(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


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

    def __post_init__(self) -> None:
        for name in ("top1", "top5"):  # an accuracy is a share: NaN, 57 or -1 is no measurement
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, _NUMBER) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")

    @classmethod
    def from_dict(cls, row: dict[str, Any], where: str = "row") -> SweepRow:
        values = [field_value(row, "size", _SIZE, where), field_value(row, "interpolation", bool, where),
                  field_value(row, "top1", _NUMBER, where), field_value(row, "top5", _NUMBER, where),
                  field_value(row, "loss", _NUMBER, where), field_value(row, "count", int, where),
                  field_value(row, "patch_shuffle", bool, where, False)]
        if values[5] < 0:
            raise ValueError(f"{where}.count must not be negative, got {values[5]}")
        try:
            return cls(*values)
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None

    def to_dict(self) -> dict[str, Any]:
        head = dict(size=self.size, interpolation=self.interpolation)
        if self.patch_shuffle:
            head["patch_shuffle"] = True
        return dict(head, top1=self.top1, top5=self.top5, loss=self.loss, count=self.count)


#: the fields of an evaluation in the order its JSON has them
_FIELDS = ("checkpoint", "architecture", "label", "dataset", "num_classes", "split", "sweep_unit", "trained_at",
           "commit")


@dataclass
class Evaluation:
    """A checkpoint swept across sizes (``pape-hub eval``, the comparisons, ``train --push-to-hub``)."""

    rows: list[SweepRow] = field(default_factory=list)
    checkpoint: str | None = None
    architecture: str | None = None
    label: str | None = None  # the name tables show: the encoding, or a comparison run's label (alibi[slope_scale=8])
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

    def at_chance(self) -> tuple[SweepRow, tuple[float, float]] | None:
        """The pass at the training size and chance's 95% interval, when its top-1 lies inside that interval (the
        model learned nothing usable); None otherwise, or when the class count is not recorded."""
        row = self.row(self.trained_at)
        if row is None or not self.num_classes or not row.count:
            return None
        low, high = chance_interval(self.num_classes, row.count)
        return (row, (low, high)) if low <= row.top1 <= high else None


    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "evaluation") -> Evaluation:
        kinds = dict(num_classes=(int, type(None)), trained_at=(int, str, type(None)))
        data = {"label": data["encoding"], **data} if "encoding" in data else data  # 0.1 wrote "encoding"
        fields = {k: field_value(data, k, kinds.get(k, _TEXT), where, None) for k in _FIELDS}
        rows = [SweepRow.from_dict(r, f"{where}.rows[{i}]")
                for i, r in enumerate(field_value(data, "rows", list, where, []))]
        return cls(rows=rows, seed=field_value(data, "seed", (int, type(None)), where, None),
                   train=field_value(data, "train", (dict, type(None)), where, None), **fields)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in _FIELDS if not (k == "num_classes" and self.num_classes is None)}
        out["rows"] = [r.to_dict() for r in self.rows]
        out.update({k: v for k, v in (("seed", self.seed), ("train", self.train)) if v is not None})
        return out


def chance_interval(num_classes: int, count: int) -> tuple[float, float]:
    """Where the top-1 of a model that guesses uniformly at random lands on ``count`` samples, 19 times in 20: the
    normal approximation of the binomial, 1/K +- 1.96 sqrt(1/K (1 - 1/K) / count)."""
    chance = 1.0 / num_classes
    half = 1.96 * math.sqrt(chance * (1 - chance) / count)
    return max(0.0, chance - half), min(1.0, chance + half)


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

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "comparison context") -> ComparisonContext:
        return cls(list_of(data, "seeds", int, where), field_value(data, "aggregate", (dict, type(None)), where, None),
                   field_value(data, "bench", (dict, type(None)), where, None))


def read_evaluation(folder: str | Path) -> tuple[Evaluation | None, ComparisonContext | None]:
    """A checkpoint folder's evaluation and comparison context, each None where the folder has none; a malformed file
    is one error naming the file and the field."""
    folder = Path(folder)
    evaluation, context = folder / EVALUATION_FILE, folder / COMPARISON_FILE
    data = read_record(evaluation, lambda d: d) if evaluation.exists() else None
    result = read_record(evaluation, Evaluation.from_dict) if data is not None else None
    if context.exists():
        return result, read_record(context, ComparisonContext.from_dict)
    if isinstance(data, dict) and "seeds" in data:  # written before the context had its own file
        return result, read_record(evaluation, ComparisonContext.from_dict)
    return result, None


#: a comparison's own fields, in the order ``summary.json`` has them after the facts
_COMPARISON_FIELDS = ("sizes", "unit", "seeds", "encodings", "failed", "aggregate", "runs", "hub", "wall_s", "title")


@dataclass
class Comparison:
    """Encodings trained over seeds and swept (``python -m lab arrows``, ``python -m lab compare``; ``summary.json``).

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

    def runs_of(self, label: str) -> list[Evaluation]:
        return [r for r in self.runs if r.label == label]

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "summary") -> Comparison:
        fields = dict(sizes=list_of(data, "sizes", _SIZE, where), unit=field_value(data, "unit", str, where),
                      seeds=list_of(data, "seeds", int, where), encodings=list_of(data, "encodings", str, where),
                      failed=list_of(data, "failed", str, where, None) or [],
                      aggregate=field_value(data, "aggregate", dict, where),
                      hub=field_value(data, "hub", (dict, type(None)), where, None),
                      wall_s=field_value(data, "wall_s", (int, type(None)), where, None),
                      title=field_value(data, "title", _TEXT, where, None))
        fields["runs"] = [Evaluation.from_dict(run, f"{where}.runs[{i}]")
                          for i, run in enumerate(list_of(data, "runs", dict, where))]
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
