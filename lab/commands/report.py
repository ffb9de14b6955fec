r"""Every table of measured numbers in the README and in ``docs/`` sits between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` and is written here from a results file, with the command, commit and wall time
that produced it (prose wrapped at 120 columns). ``--check`` changes nothing and fails (exit 1) when a block differs
from what the files give, or when the current code behaves differently from the code that measured a results file
(its recorded behaviour probes, :mod:`lab.provenance`, no longer match: re-run the command the file names). A pure
refactor keeps every result current. Results under ``results/archive/`` were measured by an earlier version and
not re-run: their blocks say so, and the check does not vouch for them.

Examples:
    python -m lab report            # rewrite the generated blocks of README.md and docs/**/*.md
    python -m lab report --check    # the release gate: pages current and every result measured by today's behaviour
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pape_hub.records import Comparison, read_record

from .. import REPOSITORY

ROOT = REPOSITORY
ARCHIVE = "archive"  # results/archive/: measured by an earlier version, kept with its provenance, not re-run
WIDTH = 120
_BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated: \2 -->)", flags=re.DOTALL)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if anything is stale")
    parser.add_argument("--page", action="append", default=None,
                        help="a page to update (repeatable; default: the checkout's README.md and docs/**/*.md)")
    parser.add_argument("--results", default=None, help="the results folder (default: the checkout's results/)")
    parser.add_argument("--archive", nargs="+", metavar="NAME", default=None,
                        help="move results/NAME to results/archive/NAME, marked as measured by --archived-version "
                             "and not re-run (its blocks say so; --check no longer vouches for it)")
    parser.add_argument("--archived-version", default=None, help="the version and commit that measured them")


def load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / name
    return read_record(path, lambda data: data) if path.exists() else None


def load_comparison(results: Path, name: str) -> Comparison | None:
    """``results/NAME/summary.json`` (or, not re-run, ``results/archive/NAME/summary.json``) as a record, None if
    not measured yet (a malformed one is named)."""
    path = results / name / "summary.json"
    if not path.exists():
        path = results / ARCHIVE / name / "summary.json"
    return read_record(path, Comparison.from_dict) if path.exists() else None


def pages(root: Path) -> list[Path]:
    """The pages whose generated blocks the report writes: the README and every page under ``docs/``."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def archive(results: Path, name: str, version: str) -> Path:
    """Move ``results/NAME`` under ``results/archive/``, its summary marked as measured by ``version`` and written
    in today's record format (the numbers are the file's own)."""
    import shutil

    from pape_hub.evaluation import write_json

    source, target = results / name, results / ARCHIVE / name
    if not (source / "summary.json").exists() or target.exists():
        raise ValueError(f"cannot archive {name!r}: {source / 'summary.json'} is missing or {target} exists")
    record = read_record(source / "summary.json", Comparison.from_dict)
    out = record.to_dict()
    out["provenance"] = dict(out["provenance"], archived=version)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(source, target)
    write_json(out, target / "summary.json")
    return target


def provenance_line(data: dict[str, Any] | Comparison) -> str:
    """Which command, commit, behaviour and machine wrote a results file (a JSON's dict or a comparison); an
    archived one says that it was not re-run."""
    if isinstance(data, Comparison):
        prov, wall = data.provenance, data.wall_s
    else:
        prov, wall = data.get("provenance", {}), data.get("wall_s")
    archived = (f"**Archived**: measured by pape_hub {prov['archived']}, whose models drew their initial weights in "
                "another order, and not re-run since; its command re-measures it. " if prov.get("archived") else "")
    return (f"{archived}Written by `{prov.get('command', '?')}` at commit `{prov.get('commit', '?')}` "
            f"(behaviour fingerprint `{prov.get('behaviour_fingerprint', '?')}`, {prov.get('machine', '?')}"
            f"{', ' + prov['cpu'] if prov.get('cpu') else ''}, "
            f"torch {prov.get('torch', '?')}){f', wall time {wall // 60} min {wall % 60} s' if wall else ''}.")


def comparison_block(results: Path, name: str, what: str) -> str:
    from ..experiment import summary_table

    data = load_comparison(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}/summary.json` is missing ({what})._\n"
    seeds = data.seeds
    over = (f"mean over seeds {', '.join(map(str, seeds))} with the 95% bootstrap interval of the mean in brackets"
            if len(seeds) > 1 else f"seed {seeds[0]}")
    folder = f"results/{ARCHIVE}/{name}" if data.provenance.get("archived") else f"results/{name}"
    lines = [summary_table(data), "",
             f"Top-1 on the test split; {over}. {provenance_line(data)} Plot: `{folder}/accuracy_vs_size.png`"
             f"; every run with its training curve: `{folder}/summary.json`."]
    if data.failed:
        lines.append(f"Runs that failed: {', '.join(data.failed)}.")
    hub = data.hub
    if hub:
        ok = [r for r, c in hub["repos"].items() if c.get("timm_identical") and c.get("transformers_identical")]
        lines.append(f"Seed-{seeds[0]} checkpoints were pushed to {hub['endpoint']} and loaded back by repo id from "
                     f"both faces with bit-identical logits: {len(ok)} of {len(hub['repos'])} "
                     f"({', '.join(f'`{r}`' for r in hub['repos'])}).")
    return "\n".join(lines) + "\n"


def bench_block(results: Path, name: str) -> str:
    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing._\n"
    out = []
    for run in data["runs"]:
        rows = run["rows"]
        base = rows["timm_ape"]
        has_train = any("train_ratio" in r for r in rows.values())
        has_compile = any("compile_speedup" in r for r in rows.values())
        train_base = run.get("train_baseline", "timm_ape")
        has_infer_mb = all("infer_tensors_mb" in r for r in rows.values())
        has_train_mb = any("train_tensors_mb" in r for r in rows.values())
        shown_base = "APE" if train_base == "timm_ape" else f"`{train_base}`"
        head = ["model", "inference ms", "× timm APE"] + (["inference MB of tensors (× timm APE)"] if has_infer_mb
                                                          else []) + ["target"] + \
            ([f"train step × {shown_base}"] if has_train else []) + \
            ([f"train step MB of tensors (× {shown_base})"] if has_train_mb else []) + \
            (["compiled: speed-up; × compiled timm APE"] if has_compile else []) + ["SDPA kernel"]
        lines = [f"ViT-{run['size'].upper()}/16 at {run['resolution']} px:", "",
                 "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for key, r in rows.items():
            target = r.get("target")
            cells = [f"`{key}`", f"{r['infer_ms']:.1f}", f"{r['infer_ms'] / base['infer_ms']:.3f}"]
            if has_infer_mb:
                cells.append(megabytes_cell(r.get("infer_tensors_mb"), base["infer_tensors_mb"]))
            cells.append((f"{target['ratio']:.3f} × `{target['vs']}` ≤ {target['max_ratio']:.2f} "
                          f"{'met' if target['met'] else '**missed**'}") if target else "")
            if has_train:
                cells.append(train_cell(r))
            if has_train_mb:
                cells.append(megabytes_cell(r.get("train_tensors_mb"), rows[train_base].get("train_tensors_mb")))
            if has_compile:
                compiled_base = base.get("compiled_ms")
                cells.append(f"{r['compile_speedup']:.2f}; {r['compiled_ms'] / compiled_base:.3f}"
                             if "compile_speedup" in r and compiled_base else r.get("compile_error", "")[:60])
            cells.append(",".join(r.get("kernels", [])))
            lines.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(lines))
    denormals = "subnormal floats flushed to zero" if data.get("flush_denormals") else "subnormal floats kept"
    trained = next((run for run in data["runs"] if "train_baseline" in run), None)
    rounds = None if trained is None else next(
        len(r["train_round_ratios"]) for r in trained["rows"].values() if "train_round_ratios" in r)
    training = "" if trained is None else (
        f"; training steps (batch {trained['train_batch_size']}, AdamW) in groups of a few models, each with "
        f"`{trained['train_baseline']}` and timed against its steps in the same rounds: medians of {rounds} rounds, "
        f"in brackets the lowest and highest round's ratio")
    tensors = "" if not any("infer_tensors_mb" in r for run in data["runs"] for r in run["rows"].values()) else (
        " MB of tensors: the peak of the tensors one call allocated beyond those live before it (torch's profiler on "
        "CPU, the caching allocator on a GPU), after the timed rounds in the same process; resident memory, the "
        "issue's measure, needs a fresh process per cell (`python -m lab memory`).")
    out.append(f"{data['device']}, {data['dtype']}, {denormals}, inference batch {data['batch_size']}, medians of "
               f"{data['repeats']} interleaved rounds{training}.{tensors} {provenance_line(data)}")
    return "\n\n".join(out) + "\n"


def train_cell(row: dict[str, Any]) -> str:
    """A bench row's training step against the baseline: the ratio of medians, and where kept the rounds' range."""
    if "train_ratio" not in row:
        return "not timed"
    rounds = row.get("train_round_ratios")
    return f"{row['train_ratio']:.3f}" + (f" ({min(rounds):.2f}-{max(rounds):.2f})" if rounds else "")


def bench_sweep_block(results: Path, name: str) -> str:
    """A bench timed at several resolutions of one size (``python -m lab bench --resolutions 224,...,1024``): every
    model's inference time and peak of a call's tensors over timm's ViT at each resolution, and the exponent of each
    in tokens from the first resolution to the last (timm's ViT's own is the line to compare with)."""
    from .bench import sweeps
    from .memory import growth

    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing._\n"
    out = []
    for size, runs in sweeps(data).items():
        resolutions = [run["resolution"] for run in runs]
        for measure, what in (("infer_ms", "inference time"), ("infer_tensors_mb", "peak of a call's tensors")):
            lines = [f"ViT-{size.upper()}/16, {what} × timm's ViT:", "",
                     "| model | " + " | ".join(f"{res} px" for res in resolutions) + " | growth in tokens |",
                     "|---" * (len(resolutions) + 2) + "|"]
            for key in runs[0]["rows"]:
                by_res = {str(run["resolution"]): run["rows"].get(key, {}) for run in runs}
                cells = [f"{by_res[str(res)][measure] / run['rows']['timm_ape'][measure]:.2f}"
                         if measure in by_res[str(res)] else "-" for res, run in zip(resolutions, runs)]
                exponent = growth(by_res, resolutions, key=measure)
                cells.append("-" if exponent is None else f"{exponent:.2f}")
                lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
            out.append("\n".join(lines))
    out.append(f"{data['device']}, {data['dtype']}, inference batch {data['batch_size']}, medians of {data['repeats']} "
               "interleaved rounds in one process; the peak of a call's tensors after them (torch's profiler on CPU, "
               "the caching allocator on a GPU). Growth: the exponent of the measure in tokens from the first "
               f"resolution to the last (1.0: linear). {provenance_line(data)}")
    return "\n\n".join(out) + "\n"


def megabytes_cell(mb: float | None, base_mb: float | None) -> str:
    """A bench row's peak of tensors, with its ratio to the baseline's where both were measured."""
    if mb is None:
        return "not timed"
    return f"{mb:.1f}" + (f" ({mb / base_mb:.2f})" if base_mb else "")


def profile_block(results: Path, name: str) -> str:
    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing._\n"
    lines = ["| encoding | forward kernels / layer | forward MB allocated / layer | training-step kernels / layer | "
             "training-step MB allocated / layer | head width in SDPA | bf16 calls / forward | × `ape` | "
             "float32 matmul |",
             "|---|---|---|---|---|---|---|---|---|"]
    ape = data["rows"].get("ape", {}).get("autocast", {}).get("calls")
    for enc, row in data["rows"].items():
        fwd, step, calls = row["forward"], row["train"], row.get("autocast")
        train_kernels = step["kernels_per_layer"] + step["backward_kernels_per_layer"]
        train_mb = (step["bytes_per_layer"] + step["backward_bytes_per_layer"]) / 2**20
        counted = (f"{calls['calls']} | {calls['calls'] / ape:.2f} | {100 * calls['float32_matmul_share']:.1f}%"
                   if calls and ape else "- | - | -")
        lines.append(f"| `{enc}` | {fwd['kernels_per_layer']:.0f} | {fwd['bytes_per_layer'] / 2**20:.1f} | "
                     f"{train_kernels:.0f} | {train_mb:.1f} | {fwd['head_width']} | {counted} |")
    lines += ["", f"ViT-{data['size'].upper()}/16 at {data['resolution']} px, batch {data['batch_size']}, float32: "
              "aten operators that do work inside the encoding's hooks per layer (views not counted; backward "
              "matched through autograd) and the bytes of the tensors they allocate. Under bf16 autocast: every aten "
              "call of one forward (views too: each is a dispatch, and on a GPU at small batches launches dominate) "
              "and the share of matrix-product FLOPs left in float32 (device-independent counts, which "
              f"`tests/test_gpu_ready.py` holds). {provenance_line(data)}"]
    return "\n".join(lines) + "\n"


def seconds(value: float) -> str:
    """A time for a table: milliseconds under a second (GPU calls), seconds above."""
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def memory_verdict(data: dict[str, Any], by_res: dict[str, Any], encoding: str, at: str,
                   machine_gb: float | None) -> str:
    """One encoding's ratio cell of :func:`memory_block`: memory (live tensors) and time against ``ape``'s at ``at``
    px and whether the issue's goal is met, or whether the call fits a machine of ``machine_gb``."""
    from .memory import GOALS

    ratio = data["ratios"].get(encoding, {}).get(at)
    if machine_gb is not None and "peak_mb" in by_res.get(at, {}):
        fits = "fits" if by_res[at]["peak_mb"] < machine_gb * 1024 else "**does not fit**"
        return f"{ratio['memory']:.2f}, {ratio['time']:.2f}: {fits} {machine_gb:.0f} GB" if ratio else fits
    if not ratio:
        return "-"
    goal = GOALS["train_memory" if data["train"] else "infer_memory"]
    memory_ok = "met" if ratio["memory"] <= goal else "**over**"
    time_ok = "" if not data["train"] else " (time " + (
        "met" if ratio["time"] <= GOALS["train_time"] else "**over**") + ")"
    tensors = f" ({ratio['tensors']:.2f})" if ratio.get("tensors") is not None else ""
    return f"{ratio['memory']:.2f}{tensors}, {ratio['time']:.2f}: memory {memory_ok}{time_ok}"


def memory_caption(data: dict[str, Any], at: str, machine_gb: float | None) -> str:
    """The sentences under :func:`memory_block`'s table: what was measured, how, and what the ratio column means."""
    from .memory import GOALS

    goal = GOALS["train_memory" if data["train"] else "infer_memory"]
    what = f"a training step, batch {data['batch_size']}" if data["train"] else f"inference, batch {data['batch_size']}"
    timed = (f"the median time of {data['repeats']} more calls" if data["repeats"] > 1 else
             "the time of one more call" if data["repeats"] else "the time of that call")
    if data.get("rounds", 1) > 1:
        timed += (f"; every cell measured in {data['rounds']} interleaved rounds (each round every encoding once), "
                  "each number the median over the rounds")
    goal_text = (f"whether the call fits a {machine_gb:.0f} GB machine (the goal), then memory and time against "
                 "`ape`'s" if machine_gb is not None else
                 f"memory against `ape`'s at {at} px (the goal: at most {goal}x), "
                 + ("in brackets the same for the peak of live tensors (torch's profiler, free of the allocator), "
                    if any(r.get("tensors_mb") for rows in data["rows"].values() for r in rows.values()) else "")
                 + "then time"
                 + (f" (the goal: at most {GOALS['train_time']}x)" if data["train"] else ""))
    if str(data.get("device", "CPU")).startswith("CPU"):
        flushed = ", subnormal floats flushed to zero" if data.get("flush_denormals") else ""
        if data.get("mmap_threshold") is not None:
            flushed += f", glibc's mmap threshold fixed at {data['mmap_threshold']} bytes (`MALLOC_MMAP_THRESHOLD_`)"
        where = (f"CPU float32, {data['threads']} threads{flushed}; each cell a fresh process: peak resident memory of "
                 "the call over the process after a 32 px warm-up (`ru_maxrss`, the issue's measure, which includes "
                 "what the C allocator keeps of freed blocks)")
    else:
        where = (f"{data['device'].replace(', torch', '; torch')}: the peak of live bytes during the first call at "
                 "each size (`torch.cuda.max_memory_allocated`) over what was allocated before it, in one process")
    return (f"ViT-{data['size'].upper()}/16, {what}, {where}, and {timed}. The ratio "
            f"column gives {goal_text}. Growth: the exponent of memory in tokens from the first to the last "
            f"resolution (1.0: linear). {provenance_line(data)}")


def memory_block(results: Path, name: str, goal_px: int = 896, machine_gb: float | None = None) -> str:
    """Peak memory and time against resolution (``python -m lab memory``), each encoding's ratio to ``ape`` at
    ``goal_px`` against the issue's goal (``machine_gb``: instead, whether the call fits a machine of that memory),
    and its memory growth exponent in tokens."""
    from .memory import growth

    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing._\n"
    resolutions = data["resolutions"]
    at = str(goal_px) if str(goal_px) in map(str, resolutions) else str(resolutions[-1])
    head = [f"{r} px" for r in resolutions]
    lines = ["| encoding | " + " | ".join(head) + f" | × `ape` at {at} px: memory (tensors), time | growth |",
             "|---" * (len(head) + 3) + "|"]
    for encoding, by_res in data["rows"].items():
        cells = []
        for r in map(str, resolutions):
            row = by_res.get(r, {})
            cells.append(f"{row['peak_mb']:.0f} MB, {seconds(row['time_s'])}" if "peak_mb" in row else
                         f"failed: {row.get('error', '?')[:40]}" if row else "not measured")
        verdict, exponent = memory_verdict(data, by_res, encoding, at, machine_gb), growth(by_res, resolutions)
        lines.append(f"| `{encoding}` | " + " | ".join(cells) + f" | {verdict} | "
                     f"{'-' if exponent is None else f'{exponent:.2f}'} |")
    lines += ["", memory_caption(data, at, machine_gb)]
    return "\n".join(lines) + "\n"


def startup_block(results: Path, name: str) -> str:
    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing._\n"
    lines = ["| command | median wall time | × `import timm` | goal |", "|---|---|---|---|"]
    for key, row in data["rows"].items():
        goal = f"{row['goal']}: {'met' if row['met'] else '**missed**'}" if row["goal"] else "baseline" \
            if key == "import timm" else ""
        lines.append(f"| `{key}` | {row['median_s']:.2f} s | {row['x_timm']:.2f} | {goal} |")
    lines += ["", f"Each in a fresh interpreter (Python {data['python']}), medians of {data['repeats']} interleaved "
              f"rounds, {data['device']}. {provenance_line(data)}"]
    return "\n".join(lines) + "\n"


def padding_block(results: Path, name: str) -> str:
    """Native-resolution batches against square ones (``python -m lab padding``): per model, time per forward of
    each form, the per-token path's cost on the same square images, and the padded batch's cost per valid token."""
    data = load(results, name)
    if data is None:
        return f"_Not measured yet: `results/{name}` is missing (`python -m lab padding --output results/{name}`)._\n"
    valid = data["valid_tokens"]
    lines = ["| model | square batch (ms) | same images as NaFlex dict (ms) | padded batch (ms) | per-token path "
             "× square | padded × square, per valid token |", "|---|---|---|---|---|---|"]
    for key, row in data["rows"].items():
        lines.append(f"| `{key}` | {row['square_ms']:.1f} | {row['naflex_square_ms']:.1f} | {row['padded_ms']:.1f} | "
                     f"{row['per_token_ratio']:.3f} | {row['padded_ratio_per_valid_token']:.3f} |")
    aspects = ", ".join(f"{a:.2f}" for a in data["padded_aspects"])
    lines += ["", f"ViT-{data['size'].upper()}/16, 8 images per batch: squares of {data['resolution']} px "
              f"({valid['square']} tokens in the batch); the same squares as timm's NaFlex dict; 8 images of aspect "
              f"ratio (h/w) {aspects}, each resized as timm's NaFlex loader does to at most "
              f"{data['padded_length']} tokens ({valid['padded']} valid of {8 * data['padded_length']}). Medians of "
              f"{data['repeats']} interleaved rounds, {data['device']}, {data['dtype']}. `timm_naflexvit` is timm's "
              f"NaFlexViT (learned table resampled per image) at the same width and depth. {provenance_line(data)}"]
    return "\n".join(lines) + "\n"


def encodings_block(results: Path) -> str:
    from .zoo import encoding_rows

    return "\n".join(encoding_rows()) + "\n\n(Generated from the code by `python -m lab report`; parameters counted " \
        "on the meta device.)\n"


def transplant_block(results: Path) -> str:
    """Fine-tuning models seeded from another encoding's model (``--init-from``) against the same budget from
    scratch."""
    runs = {name: load_comparison(results, f"transplant_{name}") for name in ("source", "seeded", "scratch")}
    missing = [name for name, data in runs.items() if data is None]
    if missing:
        return f"_Not measured yet: `results/transplant_{{{','.join(missing)}}}/summary.json` missing._\n"
    source, seeded, scratch = runs["source"], runs["seeded"], runs["scratch"]
    sizes = seeded.sizes
    labels = [f"grid {sizes[0]}", f"grid {sizes[-1]}", f"grid {sizes[-1]} interp."]

    def cells(data: Comparison, enc: str) -> str:
        cols = data.aggregate[enc]
        return " | ".join(f"{cols[label]['mean']:.3f} ± {cols[label]['std']:.3f}" if label in cols else "-"
                          for label in labels)

    lines = ["| model | epochs | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for enc in source.encodings:
        lines.append(f"| `{enc}`, the source | {source.facts['epochs']} | {cells(source, enc)} |")
    for enc in seeded.encodings:
        lines.append(f"| `{enc}` from scratch | {scratch.facts['epochs']} | {cells(scratch, enc)} |")
        lines.append(f"| `{enc}` seeded from the source | {seeded.facts['epochs']} | {cells(seeded, enc)} |")
    lines += ["", f"Top-1 on the test split, mean ± std over seeds {seeded.seeds} (each seeded model from the "
              f"source of its seed). Source: {provenance_line(source)} Seeded: {provenance_line(seeded)} "
              f"From scratch: {provenance_line(scratch)}"]
    return "\n".join(lines) + "\n"


def recipe_block(results: Path, baseline: str, other: str, learned: float = 0.30) -> str:
    """The same encodings and task under two training recipes, side by side, and whether their ranking changes:
    which encodings learn the task (test mean at the training grid >= ``learned``; chance is 0.25) and their order."""
    loaded = {name: load_comparison(results, name) for name in (baseline, other)}
    missing = [name for name, data in loaded.items() if data is None]
    if missing:
        return f"_Not measured yet: `results/{missing[0]}/summary.json` is missing._\n"
    common = [seed for seed in loaded[baseline].seeds if seed in loaded[other].seeds]
    runs = {name: on_seeds(data, common) for name, data in loaded.items()}  # the same seeds on both sides
    names = {name: data.facts["recipe"].get("recipe", "default") for name, data in runs.items()}
    sizes = runs[baseline].sizes
    labels = [f"grid {sizes[0]}", f"grid {sizes[-1]}"]
    encodings = [e for e in runs[baseline].encodings if e in runs[other].encodings]

    def cell(name: str, enc: str, label: str) -> str:
        value = runs[name].aggregate[enc][label]
        return f"{value['mean']:.3f} ± {value['std']:.3f}"

    head = [f"{label}, `{names[n]}`" for label in labels for n in runs]
    lines = ["| encoding | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    lines += [f"| `{enc}` | " + " | ".join(cell(n, enc, label) for label in labels for n in runs) + " |"
              for enc in encodings]

    stats = {n: {e: runs[n].aggregate[e][labels[0]] for e in encodings} for n in runs}
    orders = {n: sorted((e for e in encodings if stats[n][e]["mean"] >= learned), key=lambda e: -stats[n][e]["mean"])
              for n in runs}
    lines += ["", f"Learn the task (test mean at grid {sizes[0]} ≥ {learned:.2f}; chance 0.25), best first: "
              + "; ".join(f"`{names[n]}`: {', '.join(f'`{e}`' for e in o) or 'none'}" for n, o in orders.items())
              + f". {_ranking_verdict(stats, orders, baseline, other)}",
              "", f"Runs that solve grid {sizes[0]} (test top-1 ≥ 0.99), of {len(runs[other].seeds)} seeds: "
              + "; ".join(f"`{names[n]}`: " + ", ".join(f"`{e}` {_solved(runs[n], e, sizes[0])}" for e in orders[n])
                          for n in runs) + "."
              "", f"Mean ± std over seeds {runs[other].seeds}. `{names[other]}`: {provenance_line(runs[other])}"]
    return "\n".join(lines) + "\n"


def on_seeds(data: Comparison, seeds: list[int]) -> Comparison:
    """A comparison restricted to ``seeds`` (runs and aggregate)."""
    from ..experiment import aggregate

    runs = [r for r in data.runs if r.seed in seeds]
    return replace(data, runs=runs, seeds=list(seeds), aggregate=aggregate(runs, data.sizes, data.unit))


def _solved(data: Comparison, encoding: str, size: int) -> int:
    """How many of an encoding's runs reach 0.99 test top-1 at ``size``."""
    return sum((r.accuracy(size) or 0.0) >= 0.99 for r in data.runs_of(encoding))


def _ranking_verdict(stats: dict[str, dict[str, dict[str, float]]], orders: dict[str, list[str]], baseline: str,
                     other: str) -> str:
    """Whether two recipes rank the encodings that learn alike; a pair they order differently counts as a change
    only where its means lie more than one std over seeds apart under both recipes (else the seeds decide it)."""
    if set(orders[baseline]) != set(orders[other]):
        return "Ranking **changed**: another set of encodings learns the task."

    def apart(name: str, a: str, b: str) -> bool:
        x, y = stats[name][a], stats[name][b]
        return abs(x["mean"] - y["mean"]) > max(x["std"], y["std"])

    rank = {n: {e: i for i, e in enumerate(o)} for n, o in orders.items()}
    swapped = [(a, b) for a in orders[baseline] for b in orders[baseline]
               if rank[baseline][a] < rank[baseline][b] and rank[other][a] > rank[other][b]]
    real = [(a, b) for a, b in swapped if apart(baseline, a, b) and apart(other, a, b)]
    if real:
        return "Ranking **changed**: " + ", ".join(f"`{a}` and `{b}` swap" for a, b in real) + "."
    if swapped:
        return ("Same encodings learn it; " + ", ".join(f"`{a}` and `{b}`" for a, b in swapped) + " swap places, "
                "within one std over seeds, so the seeds, not the recipe, order them.")
    return "Ranking unchanged."


def modalities_block(results: Path, name: str, command: str) -> str:
    """A point-cloud or event comparison's table, then what its numbers say, computed: on the shapes, each encoding's
    drop from the canonical pose to random poses at the training size and which stay within 0.02 of their canonical
    score; on the moving dot, which encodings are above chance at the training speed and which hold 0.9 of it at
    the other speeds."""
    data = load_comparison(results, name)
    table = comparison_block(results, name, command)
    if data is None:
        return table
    stats, first = data.aggregate, data.sizes[0]
    mean = {enc: {label: c["mean"] for label, c in cols.items()} for enc, cols in stats.items()}
    if "rotated" in " ".join(map(str, data.sizes)):
        canonical, turned = f"{data.unit} {first}", f"{data.unit} {first} rotated"
        drops = sorted(((m[canonical] - m[turned], enc) for enc, m in mean.items()), reverse=True)
        kept = [f"`{enc}`" for drop, enc in sorted(drops) if drop <= 0.02]
        best, second = sorted(mean, key=lambda enc: mean[enc][turned], reverse=True)[:2]
        (b_low, b_high), (s_low, s_high) = stats[best][turned]["ci95"], stats[second][turned]["ci95"]
        apart = "apart" if b_low > s_high else "overlapping"
        verdict = (f"From the canonical pose to random poses at {first} points: " + ", ".join(
            f"`{enc}` {mean[enc][canonical]:.3f} -> {mean[enc][turned]:.3f}" for _, enc in drops) + ". Within 0.02 "
            f"of their canonical score: {', '.join(kept) or 'none'}. Best in random poses: `{best}` "
            f"({mean[best][turned]:.3f} [{b_low:.2f}, {b_high:.2f}]), then `{second}` ({mean[second][turned]:.3f} "
            f"[{s_low:.2f}, {s_high:.2f}]): intervals {apart}.")
    else:
        trained = f"{data.unit} {first}"
        others = [f"{data.unit} {s}" for s in data.sizes[1:]]
        low, high = ({enc: cols[trained]["ci95"][i] for enc, cols in stats.items()} for i in (0, 1))
        # NoPE is the bar: its tokens still carry some order (a cell's events are grouped in the order they came)
        above = [enc for enc in mean if "none" in high and enc != "none" and low[enc] > high["none"]]
        held = [f"`{enc}`" for enc in mean if all(mean[enc][o] >= 0.9 * mean[enc][trained] for o in others)]
        verdict = (f"At the training speed, above `none` (intervals apart): "
                   f"{', '.join(f'`{e}`' for e in above) or 'none'}. At least 0.9 of their training-speed score at "
                   f"every other speed and with half the events: {', '.join(held) or 'none'}.")
    return table + "\n" + verdict + "\n"


#: the issue's goals (memory and time against tokens): (goal key, what, results files with {} for "_cpu" / "_cuda", the
#: first that exists read, resolution) -- each row reads one results file (:func:`goal_ratios`: ``lab memory`` ratios,
#: or its peak against a machine for "fits", or ``lab bench``'s inference time against timm's ViT-B for "infer_time"
#: and its training step against `ape`, timed in one process, for "train_time", where there is one)
GOAL_ROWS = [
    ("infer_memory", "inference peak memory at 896 px, ViT-S/16, batch 1", ("memory_vit_s16{}.json",), "896"),
    ("infer_growth", "the same at 1024 px: growth in tokens like `ape`'s", ("memory_vit_s16{}.json",), "1024"),
    ("fits", "ViT-B/16 at 1024 px, batch 8, runs on a 24 GB machine", ("memory_vit_b16_1024_b8{}.json",), "1024"),
    ("train_memory", "training step at 448 px, ViT-S/16, batch 4: peak memory", ("memory_train_vit_s16_448{}.json",),
     "448"),
    ("train_time", "the same: time", ("bench_vit_s16_448_train{}.json", "memory_train_vit_s16_448{}.json"), "448"),
    ("infer_time", "inference time at 448 px against timm's ViT-B/16", ("bench_vit_b16_448{}.json",), "448"),
]
_SAPE2_BIAS = ("its bias depends on content: per layer both axes' (B, heads, N, N) distances and their square roots, "
               "then attention reads it as a mask; the ratio moves with the machine (the 448 px bench; the "
               "content-dependent bias on CPU)")
_EXPONENTIALS = ("matrix exponentials of every token's {}, per head and layer, {} each step (the paper's code makes "
                 "every layer's too, by torch's `matrix_exp` and its backward, and then uses layer 0's in every layer)")
_SAPE2_STEP = ("per layer both axes' (B, heads, N, N) distances, a block of query rows at a time, made in the forward, "
               "made again in backward and differentiated by hand: matrix products with, per axis, half the "
               "multiply-adds of attention's own (inner size 30 against 64) and their square roots, and attention by "
               "hand: no CPU kernel in torch 2.14 returns a bias's gradient; on the machine of `7da0dd2` it read "
               "1.42-1.46x (the training step at 448 px)")
_GPU_BLOCKS = "4 MB blocks of rotations on a GPU, for time: 2 MB blocks reach 1.51x and take 1.5x as long"
_GPU_SAPE2_MEMORY = "a few hundredths over: under autocast its distances run in float32"
_GPU_LAUNCHES = ("eager, a few kernels more per layer on a forward of a few milliseconds: the H200 waits on their "
                 "launches (compiled at 224 px: rotary 1.10-1.19x, PaPE 1.54-1.60x; the GPU section)")
_GPU_EXPONENTIALS = ("torch's `matrix_exp`{} per token, head and layer (`rotation_exp` is CPU-only: not measured "
                     "on a GPU)")
_GPU_SAPE2_STEP = ("its per-sample bias sends the step blockwise: checkpointed blocks of 128 query rows, a few dozen "
                   "kernels each, forward, again in backward, and differentiated")
_GPU_SAPE2_BIAS = "its content bias: some fifteen kernels per axis and layer"
#: why an encoding misses a goal on a device kind, where it does; encoding "*": any other encoding there (a miss with
#: neither reads "not explained": a bug to look for). (goal, device kind, encoding) -> why
MISSED_BECAUSE = {
    ("infer_time", "cpu", "sape2"): _SAPE2_BIAS,
    ("infer_time", "cpu", "sape2_ape"): _SAPE2_BIAS,
    ("infer_time", "cpu", "liere"): "a 64x64 matrix exponential per ray from the origin (61% of a grid's tokens; "
    "the others one product each), head and layer in every forward (its rotations are over `CACHE_BYTES` at this "
    "size)",
    ("train_time", "cpu", "liere8"): _EXPONENTIALS.format("8x8 blocks", "made, made again in backward and "
                                                          "differentiated") + "; a batch of 8x8 products costs per "
    "matrix more than its arithmetic, and the ratio moves with the machine: 1.41x in the run at `7da0dd2` (the "
    "training step at 448 px)",
    ("train_time", "cpu", "liere"): _EXPONENTIALS.format(
        "64x64 rotation (one a ray from the origin: 61% of a grid's tokens; the others take one product each)",
        "made, made again in backward and differentiated") + "; what is left is their squarings, 7.8 64x64 products a "
    "matrix in the forward and three times that in backward, about 0.6 TFLOP a step, bound by arithmetic (the training "
    "step at 448 px)",
    ("train_time", "cpu", "sape2"): _SAPE2_STEP,
    ("train_time", "cpu", "sape2_ape"): _SAPE2_STEP,
    ("train_memory", "cpu", "liere"): "the C allocator's heap between blocks of rotations: live tensors are 1.18x "
    "`ape`'s, and with glibc's mmap threshold fixed the step's peak is what it was with torch's `matrix_exp`",
    ("infer_memory", "cpu", "rope_mixed_ape"): "resident memory, not live tensors (`ape`'s 59.8 MB): glibc's heap; "
    "1.47x in the run at `4cba61a`, and 1.00x with glibc's mmap threshold fixed (`memory_vit_s16_896_mmap_cpu.json`)",
    ("infer_memory", "cuda", "liere8"): _GPU_BLOCKS,
    ("infer_memory", "cuda", "liere"): _GPU_BLOCKS,
    ("infer_memory", "cuda", "sape2"): _GPU_SAPE2_MEMORY,
    ("infer_memory", "cuda", "sape2_ape"): _GPU_SAPE2_MEMORY,
    ("infer_growth", "cuda", "liere8"): _GPU_BLOCKS,
    ("infer_growth", "cuda", "liere"): _GPU_BLOCKS,
    ("infer_growth", "cuda", "sape2"): _GPU_SAPE2_MEMORY,
    ("infer_growth", "cuda", "sape2_ape"): _GPU_SAPE2_MEMORY,
    ("train_time", "cuda", "liere8"): _GPU_EXPONENTIALS.format(" and its backward"),
    ("train_time", "cuda", "liere"): _GPU_EXPONENTIALS.format(" and its backward"),
    ("train_time", "cuda", "sape2"): _GPU_SAPE2_STEP,
    ("train_time", "cuda", "sape2_ape"): _GPU_SAPE2_STEP,
    ("infer_time", "cuda", "liere"): "its rotations remade in every forward (over `CACHE_BYTES`): "
    + _GPU_EXPONENTIALS.format(""),
    ("infer_time", "cuda", "sape2"): _GPU_SAPE2_BIAS,
    ("infer_time", "cuda", "sape2_ape"): _GPU_SAPE2_BIAS,
    ("train_time", "cuda", "*"): _GPU_LAUNCHES,
    ("infer_time", "cuda", "*"): _GPU_LAUNCHES,
}


def goal_ratios(data: dict[str, Any], goal: str, at: str) -> tuple[dict[str, float], float]:
    """Per encoding, the measured ratio (or GB) of ``goal`` in a results file, and the line it must stay under."""
    from .memory import GOALS

    if goal == "infer_time":
        rows = data["runs"][0]["rows"]
        base = rows["timm_ape"]["infer_ms"]
        return {k: r["infer_ms"] / base for k, r in rows.items() if not k.startswith("timm_")}, GOALS[goal]
    if goal == "train_time" and "runs" in data:  # lab bench: each step against `ape`'s in its own group and process
        run = data["runs"][0]
        if run.get("train_baseline") != "ape":
            raise ValueError(f"the training-time goal is against `ape`; this bench timed against "
                             f"{run.get('train_baseline', 'timm_ape')!r}: run it with --train-baseline ape")
        return {k: r["train_ratio"] for k, r in run["rows"].items()
                if "train_ratio" in r and not k.startswith("timm_")}, GOALS[goal]
    if goal == "fits":
        return {k: r[at]["peak_mb"] / 1024 for k, r in data["rows"].items() if "peak_mb" in r.get(at, {})}, 24.0
    field = "time" if goal == "train_time" else "memory"
    line = GOALS["infer_memory" if goal == "infer_growth" else goal]
    return {k: r[at][field] for k, r in data["ratios"].items() if r.get(at)}, line


def goals_block(results: Path) -> str:
    """Every goal of the issue on memory and time against tokens, per device measured: the worst encoding, and each
    one over the line with why (:data:`MISSED_BECAUSE`)."""
    lines = ["| goal | measured on | line | worst | over the line, and why |", "|---|---|---|---|---|"]
    for goal, what, files, at in GOAL_ROWS:
        for device, suffix in (("cpu", "_cpu"), ("cuda", "_cuda")):
            candidates = [file.format(suffix) for file in files]
            name = next((n for n in candidates if (results / n).exists()), candidates[0])
            data = load(results, name)
            if data is None:
                continue
            ratios, line = goal_ratios(data, goal, at)
            unit = " GB" if goal == "fits" else "x"
            worst = max(ratios, key=ratios.get)
            reasons: dict[str, list[str]] = {}  # why -> the encodings over the line for it, worst first
            for k in sorted((k for k, v in ratios.items() if v > line), key=lambda k: -ratios[k]):
                because = MISSED_BECAUSE.get((goal, device, k)) or MISSED_BECAUSE.get((goal, device, "*"))
                reasons.setdefault(because or "not explained", []).append(f"`{k}` {ratios[k]:.2f}{unit}")
            why = "; ".join(f"{', '.join(names)}: {because}" for because, names in reasons.items()) or "none: met"
            where = "CPU" if device == "cpu" else str(data.get("device", "GPU")).split(",")[0]
            lines.append(f"| {what} | {where} (`{name}`, commit `{data['provenance']['commit'][:7]}`) | "
                         f"{line:g}{unit} | `{worst}` {ratios[worst]:.2f}{unit} | {why} |")
    lines += ["", "Ratios against `ape` (memory, training time) or timm's ViT-B/16 (inference time), from the results "
              "files named, each measured as the tables below say: times against a baseline timed in the same process "
              "(on CPU the training step by `python -m lab bench --train-baseline ape`), memory in a fresh process per "
              "cell. Written by `python -m lab report` from those files."]
    return "\n".join(lines) + "\n"


#: README block name -> (results kind it needs, generator). Kind None: generated from code, not results.
BLOCKS: dict[str, tuple[str | None, Callable[[Path], str]]] = {
    "encodings": (None, encodings_block),
    "arrows_main_job": ("arrows", lambda r: comparison_block(r, "arrows_main_job", "`make main`")),
    "arrows_full": ("arrows", lambda r: comparison_block(r, "arrows_full", "`python -m lab arrows --full`")),
    "arrows_isolated": ("arrows", lambda r: comparison_block(r, "arrows_isolated",
                                                              "`python -m lab arrows --isolated`")),
    "arrows_isolated_sape2": ("arrows", lambda r: comparison_block(r, "arrows_isolated_sape2",
                                                                   "SaPE² on the control task")),
    "arrows_isolated_sape2_init": ("arrows", lambda r: comparison_block(r, "arrows_isolated_sape2_init",
                                                                        "SaPE² tables at std 1.0, control task")),
    "arrows_sape2_init": ("arrows", lambda r: comparison_block(r, "arrows_sape2_init",
                                                               "SaPE² tables at std 0.02 and 1.0, arrow task")),
    "arrows_pape_ri_scale": ("arrows", lambda r: comparison_block(r, "arrows_pape_ri_scale",
                                                                  "PaPE-RI with a learned w")),
    "arrows_sharper": ("arrows", lambda r: comparison_block(r, "arrows_sharper", "sharper ALiBi / PaPE-RI")),
    "arrows_rope_mixed_long": ("arrows", lambda r: comparison_block(r, "arrows_rope_mixed_long",
                                                                    "RoPE-Mixed's seed at chance, twice the schedule")),
    "transplant": ("arrows", transplant_block),
    "arrows_native": ("arrows", lambda r: native_block(r)),
    "arrows_paper_pape": ("arrows", lambda r: comparison_block(r, "arrows_main_job_paper_pape",
                                                               "`python -m lab arrows --recipe paper-pape`")),
    "recipe_bisection": ("arrows", lambda r: comparison_block(r, "recipe_bisection",
                                                              "`python -m lab.recipe_bisection`")),
    "recipes_ranking": ("arrows", lambda r: recipe_block(r, "arrows_main_job", "arrows_main_job_paper_pape")),
    "digits": ("compare", lambda r: comparison_block(r, "digits", "`python -m lab compare --dataset digits`")),
    "video": ("compare", lambda r: comparison_block(r, "video_motion", "`python -m lab compare --dataset motion`")),
    "video_absolute_long": ("compare", lambda r: comparison_block(r, "video_motion_absolute_long",
                                                                  "APE and sin-cos, three times the schedule")),
    "modalities_shapes3d": ("modalities", lambda r: modalities_block(
        r, "modalities_shapes3d", "`python -m lab modalities --task shapes3d`")),
    "modalities_movingdot": ("modalities", lambda r: modalities_block(
        r, "modalities_movingdot", "`python -m lab modalities --task movingdot`")),
    "bench_b16_224": ("bench", lambda r: bench_block(r, "bench_vit_b16_224_cpu.json")),
    "bench_b16_448": ("bench", lambda r: bench_block(r, "bench_vit_b16_448_cpu.json")),
    "profile": ("profile", lambda r: profile_block(r, "profile_vit_b16_224_cpu.json")),
    "startup": ("bench", lambda r: startup_block(r, "bench_startup_cpu.json")),
    "memory_s16": ("bench", lambda r: memory_block(r, "memory_vit_s16_cpu.json")),
    "padding_s16": ("bench", lambda r: padding_block(r, "padding_vit_s16_cpu.json")),
    "memory_s16_896_mmap": ("bench", lambda r: memory_block(r, "memory_vit_s16_896_mmap_cpu.json")),
    "memory_b16_1024_b8": ("bench", lambda r: memory_block(r, "memory_vit_b16_1024_b8_cpu.json", 1024, machine_gb=24)),
    "memory_train_s16_448": ("bench", lambda r: memory_block(r, "memory_train_vit_s16_448_cpu.json", 448)),
    "bench_s16_448_train": ("bench", lambda r: bench_block(r, "bench_vit_s16_448_train_cpu.json")),
    "bench_s16_sweep": ("bench", lambda r: bench_sweep_block(r, "bench_vit_s16_sweep_cpu.json")),
    "bench_s16_sweep_cuda": ("bench", lambda r: bench_sweep_block(r, "bench_vit_s16_sweep_cuda.json")),
    "bench_b16_cuda": ("bench", lambda r: bench_block(r, "bench_vit_b16_cuda.json")),
    "bench_b16_448_cuda": ("bench", lambda r: bench_block(r, "bench_vit_b16_448_cuda.json")),
    "bench_b16_224_compiled_cuda": ("bench", lambda r: bench_block(r, "bench_vit_b16_224_compiled_cuda.json")),
    "memory_s16_cuda": ("bench", lambda r: memory_block(r, "memory_vit_s16_cuda.json")),
    "memory_train_s16_448_cuda": ("bench", lambda r: memory_block(r, "memory_train_vit_s16_448_cuda.json", 448)),
    "goals_memory_time": ("bench", goals_block),
    "memory_b16_1024_b8_cuda": ("bench", lambda r: memory_block(r, "memory_vit_b16_1024_b8_cuda.json", 1024,
                                                                machine_gb=24)),
}


def native_block(results: Path, fixed_name: str = "arrows_aspect", native_name: str = "arrows_native",
                 learned: float = 0.9) -> str:
    """Fixed-size against native-resolution training on the arrow task, each encoding's test top-1 (no position
    interpolation) at every grid of the sweep, the two arms in adjacent rows; then, computed from the numbers, which
    encodings hold ``learned`` at every unseen grid in each arm."""
    fixed, native = load_comparison(results, fixed_name), load_comparison(results, native_name)
    if fixed is None or native is None:
        return (f"_Not measured yet: `results/{fixed_name}/summary.json` and `results/{native_name}/summary.json` "
                "(`python -m lab arrows --aspect --resume --output-dir outputs/arrows --hub none`, then "
                "`python -m lab arrows --native --hub none`)._\n")
    sizes = [s for s in fixed.sizes if s in native.sizes]
    unseen = [s for s in sizes if s != fixed.sizes[0]]
    lines = ["| encoding | trained on | " + " | ".join(f"grid {s}" for s in sizes) + " | mean of unseen grids |",
             "|---" * (len(sizes) + 3) + "|"]
    held: dict[str, list[str]] = {"fixed": [], "native": []}
    for enc in [e for e in fixed.encodings if e in native.encodings]:
        for arm, data in (("fixed", fixed), ("native", native)):
            stats = data.aggregate[enc]
            means = {s: stats[f"grid {s}"]["mean"] for s in sizes}
            cells = [f"{means[s]:.3f} [{stats[f'grid {s}']['ci95'][0]:.2f}, {stats[f'grid {s}']['ci95'][1]:.2f}]"
                     for s in sizes]
            where = "4x4 squares" if arm == "fixed" else "5 shapes, native size"
            lines.append(f"| `{enc}` | {where} | " + " | ".join(cells)
                         + f" | {sum(means[s] for s in unseen) / len(unseen):.3f} |")
            if all(means[s] >= learned for s in unseen):
                held[arm].append(f"`{enc}`")
    verdict = (f"At least {learned} at every unseen grid: trained on squares, {', '.join(held['fixed']) or 'none'}; "
               f"trained at native resolution, {', '.join(held['native']) or 'none'}.")
    shapes = native.facts.get("task", {}).get("shapes", "?")
    return "\n".join(lines + [
        "", f"Test top-1 without position interpolation, mean over seeds {', '.join(map(str, native.seeds))} with the "
        f"95% bootstrap interval of the mean. Fixed size: the main job's checkpoints (4x4 grids, 48 px squares) scored "
        f"again at more grids. Native resolution: the same recipe and budget on grids {shapes}, each image at its own "
        "size, batched as padded token sequences on timm's NaFlex machinery. Both are scored with plain image batches "
        f"at each grid. {verdict}", "", f"Fixed size: {provenance_line(fixed)}", "",
        f"Native resolution: {provenance_line(native)}"]) + "\n"


def stale_results(results: Path) -> list[str]:
    """Results files whose recorded behaviour differs from the current code's (or that record none)."""
    from ..provenance import behaviour, behaviour_differences, decode_behaviour

    problems = []
    for path in sorted(results.rglob("*.json")):
        if ARCHIVE in path.relative_to(results).parts:
            continue
        data = json.loads(path.read_text())
        prov = data.get("provenance") if isinstance(data, dict) else None
        name = path.relative_to(results.parent)
        if not prov or "behaviour" not in prov:
            problems.append(f"{name} records no behaviour fingerprint (which code wrote it?)")
            continue
        differences = behaviour_differences(decode_behaviour(prov["behaviour"]), behaviour(prov["kind"]))
        if differences:
            problems.append(f"{name} was measured by code that behaved differently (commit {prov.get('commit')}; "
                            f"{'; '.join(differences[:3])}): re-run `{prov.get('command')}`")
    return problems


_MARKER = re.compile(r"<!-- (end )?generated: (\S*) -->")


def check_markers(readme: str, where: str = "README.md") -> None:
    """Refuse, by line number, generated blocks whose markers do not pair up (a start without its end, an end
    without its start, a block opened inside another, a name used twice): rendering them would replace the
    hand-written text up to some other marker."""
    open_at: tuple[str, int] | None = None
    seen: dict[str, int] = {}
    for number, line in enumerate(readme.splitlines(), start=1):
        for match in _MARKER.finditer(line):
            end, name = bool(match.group(1)), match.group(2)
            if not end and open_at:
                raise ValueError(f"{where} line {number}: block {name!r} starts inside block {open_at[0]!r} "
                                 f"(line {open_at[1]}), whose end marker is missing")
            if not end and name in seen:
                raise ValueError(f"{where} line {number}: block {name!r} appears twice (also at line {seen[name]})")
            if end and (not open_at or open_at[0] != name):
                raise ValueError(f"{where} line {number}: an end marker of block {name!r} without its start")
            open_at, seen[name] = (None if end else (name, number)), seen.get(name, number)
    if open_at:
        raise ValueError(f"{where} line {open_at[1]}: block {open_at[0]!r} has no end marker "
                         f"(<!-- end generated: {open_at[0]} -->); nothing was rewritten")


def escape_markup(text: str) -> str:
    """A rendered block with every ``<`` that could open a tag or a comment escaped: a label or value read from a
    results file can then never add a marker or raw HTML to the page (``< 1 s`` stays as it is)."""
    return re.sub(r"<(?=[!/?A-Za-z])", "&lt;", text)


def wrap(text: str) -> str:
    """Prose lines of a block wrapped at :data:`WIDTH` columns; table rows, list items and images stay whole."""
    out = []
    for line in text.split("\n"):
        if len(line) <= WIDTH or line.startswith(("|", "!", "<")):
            out.append(line)
        else:
            out += textwrap.wrap(line, WIDTH, break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def render(readme: str, results: Path, where: str = "README.md") -> str:
    check_markers(readme, where)

    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in BLOCKS:
            raise ValueError(f"{where} names an unknown generated block {name!r}; known: {sorted(BLOCKS)}")
        return match.group(1) + wrap(escape_markup(BLOCKS[name][1](results))) + match.group(4)

    return _BLOCK.sub(replace, readme)


def check(page_paths: Path | list[Path], results: Path, behaviour: bool = True) -> list[str]:
    """Everything stale: generated blocks of the pages that differ from the results and (``behaviour``) results
    measured by code that behaved differently."""
    problems = stale_results(results) if behaviour else []
    for path in [page_paths] if isinstance(page_paths, Path) else page_paths:
        page = path.read_text()
        fresh = render(page, results, path.name)
        for (old, new) in zip(_BLOCK.finditer(page), _BLOCK.finditer(fresh)):
            if old.group(3) != new.group(3):
                problems.append(f"{path.name}: block {old.group(2)!r} differs from what the results give: run "
                                "`python -m lab report`")
    return problems


def redraw_plots(results: Path) -> None:
    """Every comparison's plot from its ``summary.json`` (a plot is a view of the results, like a table)."""
    from ..experiment import plot_results

    for path in sorted(results.glob("*/summary.json")):
        summary = read_record(path, Comparison.from_dict)
        if summary.runs:
            plot_results(summary, path.parent)


def run(args: argparse.Namespace) -> int:
    targets = [Path(p) for p in args.page] if args.page else pages(ROOT)
    results = Path(args.results or ROOT / "results")
    if args.archive:
        if not args.archived_version:
            raise ValueError("--archive needs --archived-version (e.g. '0.1.0, commit 54b330e')")
        for name in args.archive:
            print(f"archived {name} -> {archive(results, name, args.archived_version)}")
    if args.check:
        problems = check(targets, results)
        for problem in problems:
            print("STALE:", problem)
        print("results and pages are current" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    rendered = {path: render(path.read_text(), results, path.name) for path in targets}  # all or none written
    for path, text in rendered.items():
        path.write_text(text)
    redraw_plots(results)
    stale = stale_results(results)
    for problem in stale:
        print("warning:", problem)
    print(f"updated the generated blocks of {len(targets)} page(s)"
          + (f"; {len(stale)} results file(s) are stale" if stale else ""))
    return 0
