"""Comparisons of encodings: train one model per (encoding, seed) in parallel worker processes, sweep each best
checkpoint across sizes, and summarise over seeds. Shared by the main job (``python -m lab arrows``) and
``python -m lab compare`` (a dataset such as ``digits``, or the video task).

A job is a :class:`~pape_hub.training.TrainConfig` plus the evaluation sweep; a worker trains it with one thread,
evaluates it, and returns the evaluation with the training results. The summary holds every run, the aggregate
(mean, std, min, max and a bootstrap interval of the mean over seeds for each reported column) and the provenance of
the code that produced it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import re
import signal
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from pape_hub.evaluation import BOOTSTRAP_RESAMPLES, bootstrap_interval
from pape_hub.progress import Progress
from pape_hub.records import Comparison, Evaluation

__all__ = [
    "BOOTSTRAP_RESAMPLES", "DEFAULT_ENCODINGS", "add_comparison_arguments", "aggregate", "bootstrap_interval",
    "columns", "compare_encodings", "make_job", "parse_encodings", "plot_results", "run_comparison", "run_jobs",
    "small_vit", "summary_table", "train_and_evaluate", "write_results",
]

#: the encodings a comparison trains unless told otherwise (the main job's: one of each family the papers compare)
#: what a comparison plot's bars are, in its title
INTERVAL_WORDS = "mean and 95% bootstrap interval over seeds"
DEFAULT_ENCODINGS = ("ape", "rope_mixed", "pape", "pape_ri", "liere8", "alibi")


def small_vit() -> dict[str, Any]:
    """The comparisons' small ViT: the zoo's size "m" (width 96, depth 4, 4 heads, average pooling, no CLS), whose
    image models are ``vit_m12_*``; other inputs (digits' 2-px patches, video tubelets) add their own arguments."""
    from pape_hub.models import model_args_for

    keys = ("embed_dim", "depth", "num_heads", "global_pool", "class_token")
    return {k: v for k, v in model_args_for("vit_m12_ape").items() if k in keys}


def add_comparison_arguments(parser: argparse.ArgumentParser, *, seeds: str, output_dir: str, results_dir: str,
                             train_settings: tuple[str, ...]) -> None:
    """The flags every comparison has: the encodings, seeds, workers and folders, and ``train_settings`` as
    ``pape-hub train``'s own flags (unset: the command's preset)."""
    from pape_hub.commands import add_config_arguments
    from pape_hub.training import TrainConfig

    parser.add_argument("--encodings", default=",".join(DEFAULT_ENCODINGS),
                        help="comma-separated, or 'all'; arguments in brackets, e.g. alibi[slope_scale=8]")
    parser.add_argument("--seeds", default=seeds, help="comma-separated training seeds")
    add_config_arguments(parser, TrainConfig, only=train_settings, preset_defaults=True)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (one thread each)")
    parser.add_argument("--output-dir", default=None, help=f"checkpoints and logs (default {output_dir})")
    parser.add_argument("--results-dir", default=None, help=f"table, JSON and plot (default {results_dir}; 'none' "
                        "to skip)")
    parser.add_argument("--resume", action="store_true", help="keep the runs a stopped run of this command completed "
                        "with the same settings (their folders under --output-dir) and train only the others")


def compare_encodings(args: argparse.Namespace, kind: str, train: dict[str, Any], sweep: dict[str, Any],
                      sizes: list[Any], unit: str, root: Path, results_dir: Path | None, title: str,
                      facts: dict[str, Any], publish: Callable[[Comparison], dict[str, Any]] | None = None) -> int:
    """Train ``train`` (TrainConfig fields; ``{encoding}`` in its model name is replaced) for every encoding of
    ``args.encodings`` and seed of ``args.seeds``, sweep each best checkpoint (``sweep``), summarise and write the
    results (with the provenance of ``kind`` when they are written). Returns the command's exit status."""
    from pape_hub.encodings import list_encodings

    from .provenance import provenance

    seeds = [int(s) for s in args.seeds.split(",")]
    jobs = [dict(make_job(label, kwargs, seed, root, sweep=sweep,
                          train=dict(train, model=train["model"].format(encoding=enc),
                                     init_from=train["init_from"].format(seed=seed) if train.get("init_from")
                                     else None)),
                 reuse_complete=args.resume)
            for label, enc, kwargs in parse_encodings(args.encodings, list_encodings()) for seed in seeds]
    print(f"training {len(jobs)} model(s) on {train['dataset']}, {train['epochs']} epochs, {args.jobs} at a time; "
          f"evaluating at {sizes}; each run logs a line per epoch to {root}/RUN.log", flush=True)

    def describe(result: Evaluation) -> str:
        test = result.train.get("test", {}).get("top1")
        return f"best val {result.train['best_val_top1']:.3f}" + (f", test {test:.3f}" if test is not None else "")

    # the behaviour probes (seconds) only where a results file will record them
    facts = dict(provenance=provenance(kind, getattr(args, "command_line", None)) if results_dir else None, **facts)
    summary = run_comparison(jobs, args.jobs, describe, facts, sizes, unit, results_dir,
                             title=f"{title}, {INTERVAL_WORDS} {seeds}", publish=publish)
    print(f"wall time {summary.wall_s}s; checkpoints in {root}/<encoding>_seed<k>/best")
    return 1 if summary.failed else 0

_SPEC = re.compile(r"^(\w+)(?:\[(.*)\])?$")


def parse_encodings(text: str, every: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``"ape,alibi[slope_scale=8],pape_ri[position_scale=3]"`` (or ``"all"``) -> (label, encoding, arguments)
    per entry; values are read as JSON (numbers, true/false, quoted strings), else kept as text."""
    specs = re.split(r",(?![^\[]*\])", text) if text != "all" else every
    out = []
    for spec in (s.strip() for s in specs):
        match = _SPEC.match(spec)
        if not match or match.group(1) not in every:
            raise ValueError(f"unknown encoding {spec!r}; valid: {', '.join(every)} (optionally with arguments, "
                             "e.g. alibi[slope_scale=8])")
        kwargs = {}
        for item in filter(None, (match.group(2) or "").split(",")):
            key, _, value = item.partition("=")
            try:
                kwargs[key.strip()] = json.loads(value)
            except json.JSONDecodeError:
                kwargs[key.strip()] = value.strip()
        out.append((spec, match.group(1), kwargs))
    return out


def make_job(label: str, encoding_kwargs: dict[str, Any], seed: int, root: Path, train: dict[str, Any],
             sweep: dict[str, Any]) -> dict[str, Any]:
    """One (encoding, seed) job: ``train`` (TrainConfig fields) with the encoding's own arguments added to its
    ``model_kwargs``, the seed, and the run's folder ``root/<label>_seed<seed>``; ``sweep``: the evaluation."""
    folder = re.sub(r"[^\w.=-]+", "_", label).strip("_")
    model_kwargs = dict(train.get("model_kwargs", {}),
                        **({"position_encoding_kwargs": encoding_kwargs} if encoding_kwargs else {}))
    return dict(label=label, sweep=sweep, train=dict(train, model_kwargs=model_kwargs, seed=seed,
                                                         output_dir=str(root / f"{folder}_seed{seed}")))


def run_comparison(jobs: list[dict[str, Any]], workers: int, describe: Callable[[Evaluation], str],
                   facts: dict[str, Any], sizes: list[Any], unit: str, results_dir: Path | None, title: str,
                   publish: Callable[[Comparison], dict[str, Any]] | None = None) -> Comparison:
    """Run the jobs (:func:`run_jobs`), summarise them over seeds (``facts``: provenance, task, model, recipe),
    print the table, ``publish`` (e.g. push checkpoints) and write the results (:func:`write_results`)."""
    started = time.time()
    results, failed = run_jobs(jobs, workers, started, describe)
    summary = Comparison(facts, sizes, unit, seeds=list(dict.fromkeys(j["train"]["seed"] for j in jobs)),
                         encodings=list(dict.fromkeys(j["label"] for j in jobs)), runs=results,
                         aggregate=aggregate(results, sizes, unit), failed=failed)
    print("\n" + summary_table(summary))
    if publish is not None and results:
        summary.hub = publish(summary)
    summary.wall_s = round(time.time() - started)
    if results_dir is not None and results:
        write_results(summary, results_dir, title=title)
        print(f"\nwrote {results_dir}/summary.json, summary.md, accuracy_vs_size.png")
    return summary


def train_and_evaluate(job: dict[str, Any], progress: Any = None) -> Evaluation:
    """One worker: train ``job["train"]`` (TrainConfig fields), then sweep the best checkpoint with
    ``job["sweep"]`` (``evaluate_checkpoint`` arguments). Runs in its own process with one thread; its output goes
    to ``<output_dir>.log``; ``progress`` (a queue) receives one item per finished epoch."""
    import torch

    torch.set_num_threads(1)
    from pape_hub.evaluation import evaluate_checkpoint
    from pape_hub.training import TrainConfig, train

    cfg = TrainConfig(**job["train"])
    out = Path(cfg.output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    trained = complete_run(cfg) if job.get("reuse_complete") else None
    with open(out.parent / f"{out.name}.log", "a" if trained else "w") as log, redirect_stdout(log), \
            redirect_stderr(log):
        if trained is None:
            trained = train(cfg, on_epoch=None if progress is None else lambda record: progress.put(1))
        else:
            print(f"reusing the complete run in {out} (--resume: it finished with these settings)", flush=True)
            if progress is not None:
                progress.put(cfg.epochs)  # its epochs count as done
        evaluation = evaluate_checkpoint(out / "best", **job["sweep"])
    evaluation.label, evaluation.seed, evaluation.train = job["label"], cfg.seed, trained
    return evaluation


#: settings that do not change what a run computes
_INCIDENTAL = ("output_dir", "quiet", "overwrite", "resume", "num_workers", "log_with")


def complete_run(cfg: Any) -> dict[str, Any] | None:
    """The results of a run that finished in ``cfg.output_dir`` with the same settings (its saved training state
    says which), else None: ``--resume`` of a comparison keeps such runs instead of training them again."""
    from dataclasses import MISSING, asdict, fields

    out = Path(cfg.output_dir)
    try:
        results = json.loads((out / "results.json").read_text())
        saved = json.loads((out / "state" / "trainer_state.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    wanted = {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k not in _INCIDENTAL}
    # a setting added after the run was saved counts as its default: at the default it computes what it did before
    defaults = {f.name: json.loads(json.dumps(f.default)) for f in fields(cfg) if f.default is not MISSING}
    same = all(saved.get(k, defaults.get(k)) == v for k, v in wanted.items()) \
        and (out / "best" / "config.json").exists()
    return results if same and saved.get("epochs") == len(results.get("history", [])) else None


def _exit_with_parent() -> None:
    """Worker initializer: when the command that started this worker is gone (killed), the worker stops too,
    instead of training on and writing into a folder a re-run of the command will use (the kill leaves complete
    checkpoints: every folder is swapped in whole)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def run_jobs(jobs: list[dict[str, Any]], workers: int, started: float,
             describe: Callable[[Evaluation], str]) -> tuple[list[Evaluation], list[str]]:
    """Run every job (at most ``workers`` at a time, each in a fresh interpreter); returns (results in job order,
    labels of failed jobs). One failure does not stop the others. Progress counts the epochs of all jobs (each
    worker reports its finished epochs: a bar on a terminal, a line every 30 s in a log) and a line reports each
    finished job. Ctrl-C or SIGTERM ends the workers, says which runs are complete and how to keep them."""
    done: list[tuple[int, Evaluation]] = []
    failed: list[str] = []
    context = multiprocessing.get_context("spawn")  # a clean interpreter per job: no inherited threads or caches
    progress = Progress(total=sum(job["train"]["epochs"] for job in jobs), desc="training", unit="epoch")
    finished: queue.Queue = queue.Queue()  # (job index, evaluation or None, error or None), as each job ends
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops as Ctrl-C does: workers ended, said
    try:
        with context.Manager() as manager:
            epochs = manager.Queue()
            threading.Thread(target=_count_epochs, args=(epochs, progress), daemon=True).start()
            pool = context.Pool(workers, initializer=_exit_with_parent, maxtasksperchild=1)
            for i, job in enumerate(jobs):
                pool.apply_async(train_and_evaluate, (job, epochs), callback=lambda r, i=i: finished.put((i, r, None)),
                                 error_callback=lambda e, i=i: finished.put((i, None, e)))
            pool.close()
            try:
                for _ in jobs:
                    i, result, error = finished.get()
                    label = f"{jobs[i]['label']} seed {jobs[i]['train']['seed']}"
                    if error is not None:  # one failed run must not lose the others
                        failed.append(label)
                        print(f"  {label}: FAILED ({type(error).__name__}: {error}; log "
                              f"{jobs[i]['train']['output_dir']}.log)", flush=True)
                        continue
                    done.append((i, result))
                    print(f"  {label}: {describe(result)} ({time.time() - started:.0f}s)", flush=True)
            except KeyboardInterrupt:
                pool.terminate()  # the running workers end now; each folder keeps its last complete checkpoint
                pool.join()
                _say_what_is_kept(jobs, [i for i, _ in done])
                raise
            pool.join()
            epochs.put(None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.close()
    return [result for _, result in sorted(done, key=lambda item: item[0])], failed


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _say_what_is_kept(jobs: list[dict[str, Any]], finished: list[int]) -> None:
    folders = [jobs[i]["train"]["output_dir"] for i in sorted(finished)]
    print(f"\nstopped: {len(folders)} of {len(jobs)} runs complete" + (f" ({', '.join(folders)})" if folders else "")
          + "; the others were ended mid-run. Run the same command with --resume to keep the complete runs and "
          "train the others again.", flush=True)


def _count_epochs(epochs: Any, progress: Progress) -> None:
    """Advance ``progress`` by each count the workers put on the ``epochs`` queue, until a ``None``."""
    try:
        while (count := epochs.get()) is not None:
            progress.update(count)
    except (EOFError, OSError):  # the queue's manager is gone: the command was stopped
        return


def columns(sizes: list[int], unit: str = "grid") -> list[tuple[str, int, bool, bool]]:
    """(label, size, interpolation, patch shuffle) of every reported accuracy: each size, each larger size with
    position interpolation, and the training size with shuffled patches."""
    return ([(f"{unit} {s}", s, False, False) for s in sizes]
            + [(f"{unit} {s} interp.", s, True, False) for s in sizes[1:]]
            + [(f"{unit} {sizes[0]} shuffled", sizes[0], False, True)])


def aggregate(results: list[Evaluation], sizes: list[int], unit: str = "grid"
              ) -> dict[str, dict[str, dict[str, float]]]:
    """Per encoding and column: mean, std (over seeds; 0 for one seed), min, max, n and ``ci95``, the bootstrap
    interval of the mean (:func:`bootstrap_interval`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for enc in dict.fromkeys(r.label for r in results):
        runs = [r for r in results if r.label == enc]
        cols = {"best val": [r.train["best_val_top1"] for r in runs]}
        for label, size, interp, shuffle in columns(sizes, unit):
            cols[label] = [v for r in runs if (v := r.accuracy(size, interp, shuffle)) is not None]
        out[enc] = {label: dict(mean=statistics.fmean(v), std=statistics.stdev(v) if len(v) > 1 else 0.0,
                                min=min(v), max=max(v), n=len(v), ci95=bootstrap_interval(v))
                    for label, v in cols.items() if v}
    return out


def summary_table(summary: Comparison) -> str:
    """Markdown: one row per encoding, each column's mean over seeds with its 95% bootstrap interval (the mean
    alone for one seed). Aggregated from the runs the summary holds, so a summary written before the interval
    existed shows it too."""
    stats = aggregate(summary.runs, summary.sizes, summary.unit)
    labels = [label for label in ["best val"] + [c[0] for c in columns(summary.sizes, summary.unit)]
              if any(label in cols for cols in stats.values())]  # no empty column (points and events: no interp.)
    several = len(summary.seeds) > 1
    lines = ["| encoding | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for enc, cols in stats.items():
        cells = [(f"{c['mean']:.3f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]" if several else f"{c['mean']:.3f}")
                 if (c := cols.get(label)) else "-" for label in labels]
        lines.append(f"| `{enc}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(summary: Comparison, results_dir: Path, title: str) -> None:
    """summary.json (with ``title``), summary.md (the table) and the plot (:func:`plot_results`)."""
    from pape_hub.evaluation import write_json

    summary.title = title
    results_dir.mkdir(parents=True, exist_ok=True)
    write_json(summary.to_dict(), results_dir / "summary.json")
    (results_dir / "summary.md").write_text(summary_table(summary) + "\n")
    plot_results(summary, results_dir)


def plot_results(summary: Comparison, results_dir: Path) -> Path:
    """``accuracy_vs_size.png`` of a summary (the mean over seeds and its 95% bootstrap interval); ``python -m lab
    report`` redraws it from ``summary.json``, like the README's tables."""
    from pape_hub.evaluation import plot_sweep_summary

    path = results_dir / "accuracy_vs_size.png"
    # titles recorded before the bars showed the interval named the range; the bars are what the words describe
    title = (summary.title or f"{results_dir.name}: {INTERVAL_WORDS} {summary.seeds}").replace(
        "mean and range over seeds", INTERVAL_WORDS)
    plot_sweep_summary(summary.runs, path, title=title)
    return path
