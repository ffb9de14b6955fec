r"""Measured in one process. For each size and resolution the baselines (timm's ``vit_{size}_patch16_224`` with learned
APE, and timm's ``*_rope_224`` / ``*_rope_mixed_224``) and every pape_hub encoding are built once, then timed in
interleaved rounds (one call of every model per round), and the medians are compared. Inference is
``torch.inference_mode``; a training step is forward + cross-entropy + backward + AdamW step. It records which SDPA
kernel each model ran and fails if an encoding that should be fused fell back to the math kernel. Beside each time it
records the peak of the tensors one call allocates (``infer_tensors_mb``, ``train_tensors_mb``: torch's profiler on
CPU, the caching allocator on a GPU), measured after the timed rounds.

``--train-baseline ape`` times the training steps against pape_hub's own `ape` (the issue's training goal: python -m lab
bench --sizes s --resolutions 448 --batch-size 2 --train-batch-size 4 --train-baseline ape --train-skip '' --repeats 14
--output results/bench_vit_s16_448_train_cpu.json). The issue's memory measure, resident memory against tokens, and the
224 -> 1024 px sweep with its plot, is ``python -m lab memory``: on CPU resident memory needs a fresh process per cell,
which one process timing every model cannot give.

``--startup`` times start-up instead: ``import pape_hub`` against ``import timm`` and the commands' ``--help``, each
in a fresh interpreter (``python -m lab bench --startup --output results/bench_startup_cpu.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from torch.profiler import ProfilerActivity, profile

from pape_hub.encodings import list_encodings

from ..provenance import provenance
from .memory import call_tensors_mb

STARTED = time.monotonic()  # --compile-budget counts from the start of the process
TIMM_SIZE = {"t": "tiny", "s": "small", "b": "base", "l": "large"}
#: timm's own ViTs timed beside ours, key -> what follows ``vit_{size}_patch16`` in timm's name (:func:`build_models`;
#: the rotary ones where timm has the size)
TIMM_BASELINES = {"timm_ape": "", "timm_rope": "_rope", "timm_rope_mixed": "_rope_mixed"}
# (target, what it is compared with) per model key, whole-model inference time ratio; see issue "Speed"
TARGETS: dict[str, tuple[float, str]] = {
    "pape": (1.20, "timm_ape"), "pape_m8": (1.10, "timm_ape"), "pape_ri": (1.10, "timm_ape"),
    "rope": (1.05, "timm_rope"), "rope_mixed": (1.05, "timm_rope_mixed"), "polar_rope": (1.05, "timm_rope"),
    "liere8": (1.15, "timm_ape"), "liere": (1.15, "timm_ape"),
}
SDPA_KERNELS = {
    "_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_efficient_attention": "mem-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn", "_scaled_dot_product_attention_math": "math",
    "_scaled_dot_product_fused_attention_overrideable": "fused",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="b", help="comma-separated sizes from t,s,b,l (default b)")
    parser.add_argument("--resolutions", default="224", help="comma-separated image sizes (default 224)")
    parser.add_argument("--encodings", default="all", help="comma-separated encodings, or 'all'")
    parser.add_argument("--batch-size", type=int, default=8, help="inference batch size")
    parser.add_argument("--train-batch-size", type=int, default=4, help="training-step batch size (0 = skip)")
    parser.add_argument("--train-skip", default="liere",
                        help="comma-separated encodings left out of the training-step timing (dense LieRE: about a "
                             "minute per ViT-B step on 2 CPU cores, matrix_exp of every token's 64x64 rotation)")
    parser.add_argument("--train-group", type=int, default=4, help="models timed together in training (memory)")
    parser.add_argument("--train-baseline", default="timm_ape",
                        help="the model every training step is timed against, interleaved in each group (default "
                        "timm's ViT; `ape`: the issue's training goal, x pape_hub's own learned APE)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(model) inference")
    parser.add_argument("--compile-workers", type=int, default=0,
                        help="with --compile, first compile the models in this many parallel processes, which fill "
                        "inductor's on-disk caches so that the timed process compiles from them (0: no warm-up)")
    parser.add_argument("--compile-budget", type=float, default=None,
                        help="with --compile, seconds after which no further model is compiled (those left are "
                        "recorded as not compiled, not timed)")
    parser.add_argument("--warm-compile-cache", action="store_true", help=argparse.SUPPRESS)  # a worker's own mode
    parser.add_argument("--no-baselines", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (fp32 CPU, bf16 GPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="on CPU, keep subnormal floats (by default flushed to zero, as pape-hub train does)")
    parser.add_argument("--output", default="outputs/bench/bench.json",
                        help="the results JSON (a PNG plot is written beside it)")
    parser.add_argument("--startup", action="store_true",
                        help="time start-up instead: `import pape_hub` against `import timm`, and `--help` of the "
                        "commands, each in a fresh interpreter (medians of --repeats interleaved rounds)")


#: start-up commands timed by ``--startup``: label -> argv after the interpreter (``import timm`` is the baseline)
STARTUP = {
    "import timm": ["-c", "import timm"],
    "import pape_hub": ["-c", "import pape_hub"],
    # where the transformers face's cost went: paid by the first transformers import, with the face registered
    "import timm, transformers": ["-c", "import timm, transformers"],
    "import pape_hub, transformers": ["-c", "import pape_hub, transformers"],
    "pape-hub --help": ["-m", "pape_hub_cli", "--help"],
    "pape-hub train --help": ["-m", "pape_hub_cli", "train", "--help"],
    "pape-hub eval --help": ["-m", "pape_hub_cli", "eval", "--help"],
}


def startup_goal(key: str, row: dict[str, float]) -> tuple[str | None, bool | None]:
    """(goal, met) of a start-up row: ``import pape_hub`` within 1.5x ``import timm``, every ``--help`` under a
    second; no goal for the rest."""
    if key == "import pape_hub":
        return "<= 1.5 x import timm", row["x_timm"] <= 1.5
    if "help" in key:
        return "< 1 s", row["median_s"] < 1.0
    return None, None


def startup(args: argparse.Namespace) -> int:
    """Wall time of each :data:`STARTUP` command in a fresh interpreter, interleaved rounds, medians; the goal of
    the first-hour issue: ``import pape_hub`` within 1.5x ``import timm``, every ``--help`` under a second."""
    import subprocess
    import sys

    def call(argv: list[str]) -> Callable[[], Any]:
        return lambda: subprocess.run([sys.executable, *argv], check=True, capture_output=True)

    times = interleaved({k: call(v) for k, v in STARTUP.items()}, args.repeats, 1, lambda: None)
    rows = {k: dict(median_s=round(statistics.median(v), 3), runs_s=[round(t, 3) for t in v]) for k, v in times.items()}
    base = rows["import timm"]["median_s"]
    for key, row in rows.items():
        row["x_timm"] = round(row["median_s"] / base, 3)
        row["goal"], row["met"] = startup_goal(key, row)
    report = dict(provenance=provenance("bench"), kind="startup", repeats=args.repeats, python=sys.version.split()[0],
                  device=f"{platform.processor() or platform.machine()} CPU", rows=rows)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    for key, row in rows.items():
        print(f"{key:<24} {row['median_s']:6.2f} s  {row['x_timm']:5.2f} x import timm"
              + (f"  goal {row['goal']}: {'met' if row['met'] else 'missed'}" if row["goal"] else ""))
    print(f"wrote {output}")
    return 0


def build_models(size: str, res: int, encodings: list[str], device: torch.device, baselines: bool = True
                 ) -> dict[str, torch.nn.Module]:
    """Baselines first, then ours; each at ``res`` (timm's own models take img_size, ours any size)."""
    torch.manual_seed(0)
    name = TIMM_SIZE[size]
    models: dict[str, torch.nn.Module] = {}
    if baselines:
        for key, variant in TIMM_BASELINES.items():
            timm_name = f"vit_{name}_patch16{variant}_224"
            if key == "timm_ape" or timm_name in timm.list_models():  # timm has every size of its plain ViT
                models[key] = timm.create_model(timm_name, img_size=res)
    for enc in encodings:
        models[enc] = timm.create_model(f"vit_{size}16_{enc}")
        if enc == "pape":
            models["pape_m8"] = timm.create_model(f"vit_{size}16_pape", position_encoding_kwargs={"num_parabolas": 8})
    return {k: m.to(device) for k, m in models.items()}


def sdpa_kernels(model: torch.nn.Module, x: torch.Tensor) -> list[str]:
    """Names of the SDPA kernels one forward of ``model`` dispatches to."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.is_cuda else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        model(x)
    seen = {k for evt in prof.key_averages() for op, k in SDPA_KERNELS.items() if evt.key.startswith(f"aten::{op}")}
    return sorted(seen)


def cached_bytes(model: torch.nn.Module) -> int:
    enc = getattr(model, "pos_encoding", None)
    if enc is None:
        return 0
    total = 0
    for value in enc._cache.values():
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int, sync: Callable[[], None]
                ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for round_ in range(warmup + repeats):
        # each round in its own (seeded) order, so that no call is always timed after the same one (whatever a call
        # leaves behind, the allocator's state or the caches, falls on different calls in different rounds)
        keys = list(fns)
        random.Random(round_).shuffle(keys)
        for key in keys:
            fn = fns[key]
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if round_ >= warmup:
                times[key].append(time.perf_counter() - start)
    return times


def run(args: argparse.Namespace) -> int:
    if args.startup:
        return startup(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    if args.warm_compile_cache:
        return warm_compile_cache(args, device, dtype)
    flush = device.type == "cpu" and not args.keep_denormals
    if flush:
        torch.set_flush_denormal(True)  # as pape-hub train does: subnormal floats are slow on CPU
    encodings = list_encodings() if args.encodings == "all" else args.encodings.split(",")
    if args.train_batch_size and args.train_baseline not in (*TIMM_BASELINES, *encodings):
        raise ValueError(f"--train-baseline {args.train_baseline!r} is not among the models timed: name one of "
                         f"{', '.join((*TIMM_BASELINES, *encodings))}, or add it to --encodings")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    report: dict[str, Any] = dict(provenance=provenance("bench"), device=device_name, dtype=str(dtype),
                                  flush_denormals=flush, torch=torch.__version__,
                                  timm=timm.__version__, batch_size=args.batch_size, repeats=args.repeats, runs=[])
    failures = []
    print(f"device: {device_name}, dtype {dtype}, batch {args.batch_size}, {args.repeats} interleaved rounds",
          flush=True)

    for size in args.sizes.split(","):
        for res in (int(r) for r in args.resolutions.split(",")):
            rows, run_failures = measure(size, res, encodings, args, device, dtype)
            failures += run_failures
            report["runs"].append(dict(size=size, resolution=res, rows=rows, **(
                dict(train_baseline=args.train_baseline, train_batch_size=args.train_batch_size)
                if args.train_batch_size else {})))
            output.write_text(json.dumps(report, indent=2))  # after every run: a killed sweep keeps what it measured
            print_table(size, res, rows)
            gc.collect()

    plot(report, output.with_suffix(".png"))
    print(f"\nwrote {output} and {output.with_suffix('.png')}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


def measure(size: str, res: int, encodings: list[str], args: argparse.Namespace, device: torch.device,
            dtype: torch.dtype) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Time every model at one size and resolution; returns a row per model and kernel failures."""
    models = build_models(size, res, encodings, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.randn(args.batch_size, 3, res, res, device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    failures = []
    for m in models.values():
        m.eval()
    with autocast:
        kernels = {k: sdpa_kernels(m, x) for k, m in models.items()}
    for key, m in models.items():
        enc = getattr(m, "pos_encoding", None)
        if enc is not None and enc.fused and "math" in kernels[key]:
            failures.append(f"{key} @ {size}/{res}: fused encoding fell back to the math SDPA kernel")

    def infer(m: torch.nn.Module) -> Callable[[], Any]:
        def step() -> Any:
            with torch.inference_mode(), autocast:
                return m(x)
        return step

    times = interleaved({k: infer(m) for k, m in models.items()}, args.repeats, args.warmup, sync)
    rows: dict[str, dict[str, Any]] = {}
    for key, m in models.items():
        med = statistics.median(times[key])
        rows[key] = dict(infer_ms=med * 1e3, infer_img_s=args.batch_size / med, kernels=kernels[key],
                         cache_mb=cached_bytes(m) / 2**20, infer_tensors_mb=call_tensors_mb(infer(m), device))

    if args.compile:
        if args.compile_workers:
            spawn_compile_warmers(size, res, encodings, args)
        measure_compiled(models, infer, rows, args, sync)
    if args.train_batch_size:
        measure_training(models, rows, args, res, device, autocast, sync)

    base = rows["timm_ape"]
    for key, row in rows.items():
        row["infer_ratio"] = row["infer_ms"] / base["infer_ms"]
        if key in TARGETS and TARGETS[key][1] in rows:
            target, ref = TARGETS[key]
            ratio = row["infer_ms"] / rows[ref]["infer_ms"]
            row["target"] = dict(max_ratio=target, vs=ref, ratio=ratio, met=ratio <= target)
    return rows, failures


def measure_compiled(models: dict[str, torch.nn.Module], infer: Callable[[torch.nn.Module], Callable[[], Any]],
                     rows: dict[str, dict[str, Any]], args: argparse.Namespace, sync: Callable[[], Any]) -> None:
    """``torch.compile`` inference times (compiled outside the timed rounds) into ``rows``; on a GPU also the peak
    memory of one compiled call. A model that fails to compile, or comes after ``--compile-budget``, is recorded
    as such and left out of the timed rounds."""
    # every model shares VisionTransformer.forward's code object, and dynamo keeps at most recompile_limit graphs
    # per code object (8): past it a model would run eager and be timed as compiled
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(models))
    compiled = {}
    for key, m in models.items():
        if args.compile_budget is not None and time.monotonic() - STARTED > args.compile_budget:
            rows[key]["compile_error"] = f"not compiled: past --compile-budget {args.compile_budget:.0f} s"
            continue
        start = time.perf_counter()
        try:
            compiled[key] = torch.compile(m)
            infer(compiled[key])()
        except Exception as error:  # noqa: BLE001 - one encoding's compiler failure is a result, not the end
            compiled.pop(key, None)
            rows[key]["compile_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            continue
        rows[key]["compile_s"] = time.perf_counter() - start
        print(f"compiled {key} in {rows[key]['compile_s']:.1f} s", flush=True)
    ctimes = interleaved({k: infer(cm) for k, cm in compiled.items()}, args.repeats, 1, sync)
    for key, cm in compiled.items():
        rows[key]["compiled_ms"] = statistics.median(ctimes[key]) * 1e3
        rows[key]["compile_speedup"] = rows[key]["infer_ms"] / rows[key]["compiled_ms"]
        if torch.cuda.is_available() and next(cm.parameters()).is_cuda:
            torch.cuda.reset_peak_memory_stats()
            infer(cm)()
            rows[key]["compiled_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20


def spawn_compile_warmers(size: str, res: int, encodings: list[str], args: argparse.Namespace) -> None:
    """Compile the same models at the same shapes in ``--compile-workers`` parallel processes first: inductor keeps
    what they compile on disk (FX graph and kernel caches), so the timed process's compiles become cache hits."""
    import subprocess
    import sys

    chunks = [encodings[i :: args.compile_workers] for i in range(args.compile_workers)]
    common = ["--sizes", size, "--resolutions", str(res), "--batch-size", str(args.batch_size), "--device",
              args.device, "--dtype", args.dtype, "--warm-compile-cache"]
    workers = [subprocess.Popen([sys.executable, "-m", "lab", "bench", *common, "--encodings", ",".join(chunk)]
                                + ([] if i == 0 else ["--no-baselines"])) for i, chunk in enumerate(chunks) if chunk]
    start = time.perf_counter()
    codes = [w.wait() for w in workers]
    print(f"compile warm-up: {len(workers)} processes in {time.perf_counter() - start:.0f} s, exit codes {codes}",
          flush=True)


def warm_compile_cache(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> int:
    """A warm-up worker: compile and call each model once; failures are left to the timed process to record."""
    res = int(args.resolutions.split(",")[0])
    models = build_models(args.sizes.split(",")[0], res, args.encodings.split(","), device,
                          baselines=not args.no_baselines)
    x = torch.randn(args.batch_size, 3, res, res, device=device)
    for m in models.values():
        m.eval()
        try:
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                torch.compile(m)(x)
        except Exception:  # noqa: BLE001, S112 - the timed process compiles again and records the error
            continue
    return 0


def measure_training(models: dict[str, torch.nn.Module], rows: dict[str, dict[str, Any]], args: argparse.Namespace,
                     res: int, device: torch.device, autocast: Any, sync: Callable[[], Any]) -> None:
    """Training-step times (AdamW) into ``rows``, each against ``--train-baseline`` timed in the same group: the median
    step over the group's rounds, its ratio to the baseline's median, and each round's ratio (``train_round_ratios``:
    both steps of one round, what the machine's drift between rounds leaves out)."""
    xt = torch.randn(args.train_batch_size, 3, res, res, device=device)
    yt = torch.randint(0, 1000, (args.train_batch_size,), device=device)

    def train(m: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[], Any]:
        def step() -> Any:
            with autocast:
                loss = torch.nn.functional.cross_entropy(m(xt).float(), yt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    baseline = args.train_baseline
    # AdamW state for every model at once does not fit in memory (ViT-B: ~1 GB each), so models are timed in
    # groups, each interleaved with the baseline; a ratio is against the baseline of its own group.
    skip = set(filter(None, args.train_skip.split(",")))
    others = [k for k in models if k != baseline and k not in skip]
    base_times: list[float] = []
    for start in range(0, len(others), args.train_group):
        group = [baseline, *others[start : start + args.train_group]]
        optimizers = {k: torch.optim.AdamW(models[k].parameters(), lr=1e-5) for k in group}
        for k in group:
            models[k].train()
        ttimes = interleaved({k: train(models[k], optimizers[k]) for k in group}, max(3, args.repeats // 2), 1, sync)
        base = statistics.median(ttimes[baseline])
        base_times.append(base)
        # after the timed rounds: the profiler's own cost stays out of the times (the baseline's in its first group)
        for key in group if start == 0 else group[1:]:
            rows[key]["train_tensors_mb"] = call_tensors_mb(train(models[key], optimizers[key]), device)
        for key in group[1:]:
            med = statistics.median(ttimes[key])
            rows[key].update(train_ms=med * 1e3, train_img_s=args.train_batch_size / med, train_ratio=med / base,
                             train_round_ratios=[t / b for t, b in zip(ttimes[key], ttimes[baseline])])
        del optimizers
        gc.collect()
    base = statistics.median(base_times)
    rows[baseline].update(train_ms=base * 1e3, train_img_s=args.train_batch_size / base, train_ratio=1.0)


def print_table(size: str, res: int, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\nViT-{size.upper()}/16 @ {res}px")
    header = (f"{'model':<16} {'infer ms':>9} {'img/s':>7} {'x APE':>6} {'MB':>7} {'train img/s':>11} {'x base':>6} "
              f"{'MB':>7} {'compiled x':>10} {'cache MB':>8}  {'kernel':<14} target")
    print(header + "\n" + "-" * len(header))
    for key, r in rows.items():
        target = r.get("target")
        tgt = (f"{target['ratio']:.3f} vs {target['vs']} <= {target['max_ratio']:.2f} "
               f"{'met' if target['met'] else 'MISSED'}") if target else ""
        print(f"{key:<16} {r['infer_ms']:>9.1f} {r['infer_img_s']:>7.1f} {r['infer_ratio']:>6.3f} "
              f"{r.get('infer_tensors_mb', float('nan')):>7.1f} "
              f"{r.get('train_img_s', float('nan')):>11.2f} {r.get('train_ratio', float('nan')):>6.3f} "
              f"{r.get('train_tensors_mb', float('nan')):>7.1f} "
              f"{r.get('compile_speedup', float('nan')):>10.2f} {r['cache_mb']:>8.1f}  "
              f"{','.join(r['kernels']):<14} {tgt}", flush=True)


def sweeps(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The runs of each size timed at more than one resolution, smallest first: a resolution sweep."""
    by_size: dict[str, list[dict[str, Any]]] = {}
    for run_ in report["runs"]:
        by_size.setdefault(run_["size"], []).append(run_)
    return {size: sorted(runs, key=lambda r: r["resolution"]) for size, runs in by_size.items() if len(runs) > 1}


def plot(report: dict[str, Any], path: Path) -> None:
    """Each run's inference time against timm's ViT, as bars; a resolution sweep instead as time and tensors against
    tokens, log-log (:func:`plot_sweeps`)."""
    from matplotlib.figure import Figure

    if sweeps(report):
        plot_sweeps(report, path)
        return
    runs = report["runs"]
    fig = Figure(figsize=(10, 3.2 * len(runs)))
    axes = fig.subplots(len(runs), 1, squeeze=False)
    for ax, run_ in zip(axes[:, 0], runs):
        keys = list(run_["rows"])
        ratios = [run_["rows"][k]["infer_ratio"] for k in keys]
        colors = ["tab:gray" if k.startswith("timm_") else "tab:blue" for k in keys]
        ax.bar(keys, ratios, color=colors)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel("inference time / timm APE")
        ax.set_title(f"ViT-{run_['size'].upper()}/16 @ {run_['resolution']}px - {report['device']}, {report['dtype']}")
        ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_sweeps(report: dict[str, Any], path: Path, patch: int = 16) -> None:
    """Per swept size, inference time and the peak of a call's tensors against tokens, log-log, a line per model
    (timm's ViT black, its other baselines dashed grey)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    by_size = sweeps(report)
    fig = Figure(figsize=(12, 4.8 * len(by_size)))
    axes = fig.subplots(len(by_size), 2, squeeze=False)
    cmap = colormaps["tab20"]
    for (size, runs), row_axes in zip(by_size.items(), axes):
        tokens = [(run_["resolution"] // patch) ** 2 + 1 for run_ in runs]
        for i, key in enumerate(runs[0]["rows"]):
            style = dict(color="black", lw=2.2) if key == "timm_ape" else \
                dict(color="grey", lw=1.0, ls="--") if key.startswith("timm_") else dict(color=cmap(i % 20), lw=1.1)
            for ax, measure in zip(row_axes, ("infer_ms", "infer_tensors_mb")):
                points = [(t, run_["rows"][key][measure]) for t, run_ in zip(tokens, runs)
                          if measure in run_["rows"].get(key, {})]
                if points:
                    ax.plot(*zip(*points), marker="o", ms=3, label=key, **style)
        for ax, label in zip(row_axes, ("inference time of one call (ms)", "peak of one call's tensors (MB)")):
            ax.set(xscale="log", yscale="log", xlabel="tokens (log)", ylabel=label + " (log)",
                   title=f"ViT-{size.upper()}/16, batch {report['batch_size']}")
            ax.grid(alpha=0.3, which="both")
            ax.set_xticks(tokens, labels=[f"{t}" for t in tokens], fontsize=8, rotation=45)  # the swept sizes
            ax.xaxis.set_minor_formatter(NullFormatter())
        row_axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{report['device']}, {report['dtype']}: medians of {report['repeats']} interleaved rounds",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
