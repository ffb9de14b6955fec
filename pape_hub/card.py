"""Model cards written with ``huggingface_hub.ModelCard`` from measured results only (an eval JSON from
``pape-hub eval`` / the main job, and optionally a benchmark JSON from ``pape-hub bench``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

__all__ = ["render_model_card", "write_model_card"]


def _sweep_table(evaluation: dict[str, Any]) -> str:
    rows = [r for r in evaluation["rows"] if not r.get("patch_shuffle")]
    sizes = sorted({r["size"] for r in rows})
    head = f"| {evaluation['sweep_unit']} | " + " | ".join(str(s) for s in sizes) + " |"
    lines = [head, "|---" * (len(sizes) + 1) + "|"]
    for interp in (False, True):
        cells = []
        for size in sizes:
            hit = [r["top1"] for r in rows if r["size"] == size and r["interpolation"] == interp]
            cells.append(f"{hit[0]:.3f}" if hit else "-")
        lines.append(f"| top-1{' (position interpolation)' if interp else ''} | " + " | ".join(cells) + " |")
    shuffled = [r for r in evaluation["rows"] if r.get("patch_shuffle")]
    if shuffled:
        lines.append("")
        lines.append("Patch-shuffle test (LieRE table 5), top-1 with the patches of each image permuted: " + ", ".join(
            f"{r['size']}: {r['top1']:.3f}" for r in shuffled))
    return "\n".join(lines)


def _bench_table(bench: dict[str, Any], encoding: str) -> str:
    lines = ["| image size | this encoding, ms | timm APE ViT, ms | ratio |", "|---|---|---|---|"]
    for run in bench["runs"]:
        row, base = run["rows"].get(encoding), run["rows"]["timm_ape"]
        if row:
            lines.append(f"| {run['resolution']} | {row['infer_ms']:.1f} | {base['infer_ms']:.1f} | "
                         f"{row['infer_ms'] / base['infer_ms']:.3f} |")
    return "\n".join(lines) + f"\n\nViT-{bench['runs'][0]['size'].upper()}/16, {bench['device']}, {bench['dtype']}, " \
        f"batch {bench['batch_size']}, medians of {bench['repeats']} interleaved rounds (commit {bench['commit']})."


def render_model_card(config: dict[str, Any], evaluation: dict[str, Any] | None = None,
                      bench: dict[str, Any] | None = None, plot: str | None = None) -> ModelCard:
    """A card for a checkpoint folder's ``config.json`` (timm + pape_hub fields)."""
    meta = config.get("pape_hub", {})
    encoding = meta.get("encoding", "?")
    dataset = meta.get("dataset", {})
    data = ModelCardData(library_name="timm", license="apache-2.0", pipeline_tag="image-classification",
                         tags=["image-classification", "timm", "transformers", "pape_hub", f"pe-{encoding}"])
    sections = [
        f"# {config['architecture']} ({encoding} position encoding)",
        f"A Vision Transformer with the `{encoding}` position encoding from "
        "[pape_hub](https://github.com/pape-hub/pape_hub). It loads from both faces:",
        "```python\nimport pape_hub, timm\nmodel = timm.create_model(\"hf-hub:REPO_ID\", pretrained=True)\n"
        "from transformers import AutoModelForImageClassification\n"
        "model = AutoModelForImageClassification.from_pretrained(\"REPO_ID\", trust_remote_code=True)\n```",
        "## Training",
        f"- model arguments: `{json.dumps(config.get('model_args', {}))}`",
        f"- data: `{json.dumps(dataset)}`",
        f"- best epoch {meta['epoch'] + 1} (1-based), validation top-1 {meta['val_top1']:.3f}"
        if "val_top1" in meta else "- validation: not recorded",
    ]
    if evaluation:
        sections += ["## Evaluation", f"Trained at {evaluation['sweep_unit']} {evaluation['trained_at']}; "
                     f"split: {evaluation['split']}; "
                     f"commit {evaluation['commit']}.", _sweep_table(evaluation)]
        if plot:
            sections.append(f"![accuracy against size]({plot})")
    else:
        sections += ["## Evaluation", "No evaluation was run for this checkpoint."]
    if bench:
        sections += ["## Speed", _bench_table(bench, encoding)]
    sections += ["## Limitations", "Numbers above are the only claims this card makes; each comes from the run "
                 "named beside it."]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def write_model_card(checkpoint: str | Path, evaluation: dict[str, Any] | None = None,
                     bench: dict[str, Any] | None = None, plot: str | None = None) -> Path:
    """Write ``README.md`` into a checkpoint folder."""
    checkpoint = Path(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    path = checkpoint / "README.md"
    render_model_card(config, evaluation, bench, plot).save(str(path))
    return path
