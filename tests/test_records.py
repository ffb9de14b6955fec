"""Result records (:mod:`pape_hub.records`): the JSON files are the records' own layout, and a checkpoint's
evaluation stays as measured while its comparison context lives beside it."""

from __future__ import annotations

import json
from pathlib import Path

from pape_hub.records import Comparison, ComparisonContext, Evaluation, read_evaluation

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_summary_round_trips_byte_for_byte():
    summaries = sorted((ROOT / "results").rglob("summary.json"))  # archived ones too
    assert summaries
    for path in summaries:
        data = json.loads(path.read_text())
        record = Comparison.from_dict(data)
        assert json.dumps(record.to_dict()) == json.dumps(data), path
        assert all(isinstance(run, Evaluation) for run in record.runs)


def test_one_row_lookup():
    run = Comparison.from_dict(json.loads((ROOT / "results" / "arrows_main_job" / "summary.json").read_text())).runs[0]
    raw = run.to_dict()["rows"]
    assert run.accuracy(4) == next(r["top1"] for r in raw if r["size"] == 4 and not r["interpolation"]
                                   and not r.get("patch_shuffle"))
    assert run.accuracy(4, patch_shuffle=True) == next(r["top1"] for r in raw if r.get("patch_shuffle"))
    assert run.accuracy(4, interpolation=True) is None and run.sizes() == [4, 6, 8]


def test_comparison_context_lives_beside_the_evaluation(tmp_path):
    evaluation = Evaluation.from_dict(dict(rows=[dict(size=4, interpolation=False, top1=0.5, top5=1.0, loss=1.0,
                                                      count=8)], sweep_unit="grid", trained_at=4, seed=0))
    old = dict(evaluation.to_dict(), seeds=[0, 1], aggregate={"grid 4": {"mean": 0.5}}, bench=None)
    (tmp_path / "eval.json").write_text(json.dumps(old))  # a folder written before the context had its own file
    read, context = read_evaluation(tmp_path)
    assert read.to_dict() == evaluation.to_dict() and context.seeds == [0, 1]
    (tmp_path / "eval.json").write_text(json.dumps(evaluation.to_dict()))
    ComparisonContext([0, 1], {"grid 4": {"mean": 0.5}}).write(tmp_path)
    read, context = read_evaluation(tmp_path)
    assert read.accuracy(4) == 0.5 and context.aggregate == {"grid 4": {"mean": 0.5}}
    assert read_evaluation(tmp_path / "missing") == (None, None)


#: the layers of ARCHITECTURE.md, bottom first: a module imports its own layer and those below, never above
LAYERS = [("folder",), ("encodings",), ("layers",), ("models",), ("hf",), ("records",),
          ("checkpoint", "card", "settings", "import_hooks", "progress", "cpu"), ("recipes",), ("data", "hub"),
          ("evaluation",), ("training",),
          ("commands", "run"), ("__init__",)]


def test_imports_run_downwards_only():
    import ast

    rank = {name: i for i, names in enumerate(LAYERS) for name in names}
    package = ROOT / "pape_hub"
    upward = []
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        own = rank[parts[1].removesuffix(".py")]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:  # relative imports, function-level ones too
                base = parts[: len(parts) - node.level]
                target = (list(base) + (node.module.split(".") if node.module else [node.names[0].name]))[1]
                if rank.get(target, -1) > own:
                    upward.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            upward += [f"{path.relative_to(ROOT)}:{node.lineno} imports the lab" for n in names
                       if n.split(".")[0] == "lab"]  # the lab imports the package, never the reverse
    assert not upward, upward
