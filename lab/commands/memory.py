r"""Peak memory and time against tokens, every encoding, each measurement in a fresh process.

Inference (default): ViT-S/16 (random weights), batch 1, ``torch.inference_mode``. In a fresh interpreter the model is
built and run once on a 32 px image (so that libraries, weights and kernels are loaded), ``ru_maxrss`` is read, one
forward at the resolution runs, and ``ru_maxrss`` is read again: the difference is the peak activation memory of
that forward (the issue's measure, which includes what the C allocator keeps of freed blocks). The same process then
times ``--repeats`` more forwards (median) and runs one more under torch's profiler, whose allocation events give the
peak of live tensors (``tensors_mb``: independent of the allocator). ``--train``:
one training step instead (forward, cross-entropy, backward, AdamW), batch ``--batch-size``, after one warm-up step
at the same size; memory is the growth over the warm-up 32 px step, time the median of the next steps.
``--rounds N`` measures every cell N times, in interleaved rounds (each round every encoding once, the baseline first),
and keeps each number's median over the rounds: a machine's drift during a run falls on every encoding alike instead
of on whichever ran then (`ape`'s training step at 448 px read 3.1-4.1 s across runs on one CPU). Subnormal
floats are flushed to zero, as ``pape-hub train`` and ``python -m lab bench`` do (on an Intel Xeon a PaPE training
step took 11x `ape`'s with them, 27.6 s to 2.5 s at 448 px).

On a GPU (``--device cuda``, bfloat16 autocast by default) one process serves every measurement: torch's caching
allocator counts live bytes exactly, so the peak of a call is ``torch.cuda.max_memory_allocated`` over what was
allocated before it (weights, optimizer state), free of whatever an earlier model left cached; times are medians of
``--repeats`` synchronised calls after the measured one.

    python -m lab memory --output results/memory_vit_s16_cpu.json                  # 224 -> 1024 px sweep
    python -m lab memory --train --resolutions 448 --batch-size 4 --rounds 3 \
        --output results/memory_train_vit_s16_448_cpu.json
    python -m lab memory --device cuda --output results/memory_vit_s16_cuda.json    # the same sweep on a GPU, bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pape_hub.encodings import list_encodings

from ..provenance import provenance

#: the issue's goals: (inference memory at 896 px, x ape), (training memory at 448 px, x ape), (training time, x ape),
#: (inference time at 448 px, x timm's ViT-B: `python -m lab bench`)
GOALS = dict(infer_memory=1.5, train_memory=2.0, train_time=1.5, infer_time=1.25)

PROBE = r"""
import json, resource, statistics, sys, time
sys.path.insert(0, {root!r})  # this checkout's lab, for call_tensors_mb
import torch, timm, pape_hub
from lab.commands.memory import call_tensors_mb
torch.set_num_threads({threads})
torch.set_flush_denormal(True)  # as pape-hub train and the bench do: PaPE's softmax backward makes subnormal floats
encoding, res, train, batch, repeats, size = {encoding!r}, {res}, {train}, {batch}, {repeats}, {size!r}
profiled = {profiled}
torch.manual_seed(0)
model = timm.create_model(f"vit_{{size}}16_{{encoding}}", num_classes=1000)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB
if train:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    def step(px):
        x, y = torch.randn(batch, 3, px, px), torch.randint(0, 1000, (batch,))
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.train()
    step(32)
    before = rss()
    start = time.perf_counter(); step(res); first = time.perf_counter() - start
    peak = rss() - before
    times = [first]
    for _ in range(repeats - 1):
        start = time.perf_counter(); step(res); times.append(time.perf_counter() - start)
else:
    model.eval()
    with torch.inference_mode():
        model(torch.randn(batch, 3, 32, 32))
        before = rss()
        x = torch.randn(batch, 3, res, res)
        start = time.perf_counter(); model(x); first = time.perf_counter() - start
        peak = rss() - before
        times = []
        for _ in range(repeats):
            start = time.perf_counter(); model(x); times.append(time.perf_counter() - start)
def again():  # the same call once more
    if train:
        step(res)
    else:
        with torch.inference_mode():
            model(x)
tensors = call_tensors_mb(again, torch.device("cpu")) if profiled else None
print(json.dumps(dict(peak_mb=peak, tensors_mb=tensors,
                      time_s=statistics.median(times) if times else first, first_s=first)))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="s", help="model size from t, s, b (default s: ViT-S/16)")
    parser.add_argument("--resolutions", default="224,448,640,896,1024", help="comma-separated image sizes")
    parser.add_argument("--encodings", default="all", help="comma-separated encodings, or 'all'")
    parser.add_argument("--train", action="store_true", help="time and measure a training step instead")
    parser.add_argument("--batch-size", type=int, default=4, help="training batch")
    parser.add_argument("--inference-batch-size", type=int, default=1, help="inference batch")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled call that gives the peak of live "
                        "tensors (one forward less: for the slowest sizes)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after the measured one (median)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds: every encoding's cells once a "
                        "round, in fresh processes; each cell's numbers are medians over rounds (what a machine's "
                        "drift does falls on every encoding alike)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads in each process")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per process")
    parser.add_argument("--device", default="cpu", help="cpu (each cell a fresh process) or cuda (one process, "
                        "torch's allocator statistics)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="auto: float32 on CPU (the only one there), bfloat16 autocast on a GPU")
    parser.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                        help="CPU: fix glibc's mmap threshold in each cell's process (MALLOC_MMAP_THRESHOLD_), so that "
                        "every freed block over it goes back to the system at once and resident memory follows live "
                        "tensors; by default glibc raises the threshold to the largest block freed so far (up to "
                        "32 MB) and keeps smaller freed blocks in its heap")
    parser.add_argument("--output", default="outputs/memory/memory.json", help="results JSON (a PNG beside it)")


def probe(encoding: str, res: int, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh interpreter's measurement; a failure (out of memory, timeout) is recorded, not raised."""
    code = PROBE.format(root=str(Path(__file__).resolve().parents[2]), threads=args.threads, encoding=encoding,
                        res=res, train=args.train, size=args.size, repeats=args.repeats, profiled=not args.no_profile,
                        batch=args.batch_size if args.train else args.inference_batch_size)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=args.timeout,
                              env=probe_environment(args))
    except subprocess.TimeoutExpired:
        return dict(error=f"over {args.timeout} s")
    if done.returncode:
        return dict(error=(done.stderr.strip().splitlines() or ["killed"])[-1][:300])
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpu_probe(encoding: str, resolutions: list[int], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every resolution of one encoding on the GPU, in this process: the peak of live bytes during the first call
    at each size over what was allocated before it, then the median of ``--repeats`` synchronised calls."""
    import statistics
    import time

    import timm
    import torch

    device = torch.device(args.device)
    dtype = getattr(torch, gpu_dtype(args))
    torch.manual_seed(0)
    model = timm.create_model(f"vit_{args.size}16_{encoding}", num_classes=1000).to(device)
    batch = args.batch_size if args.train else args.inference_batch_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if args.train else None

    def call(px: int) -> None:
        x = torch.randn(batch, 3, px, px, device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            if optimizer is None:
                with torch.inference_mode():
                    model(x)
                return
            y = torch.randint(0, 1000, (batch,), device=device)
            torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train(args.train)
    call(32)  # kernels loaded, optimizer state allocated
    rows: dict[str, dict[str, Any]] = {}
    for res in resolutions:
        try:
            start = time.perf_counter()
            peak = call_tensors_mb(lambda: call(res), device)  # noqa: B023 - called at once
            first = time.perf_counter() - start
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                call(res)
                torch.cuda.synchronize(device)
                times.append(time.perf_counter() - start)
            rows[str(res)] = dict(peak_mb=peak, tensors_mb=None, first_s=first,
                                  time_s=statistics.median(times) if times else first)
        except torch.OutOfMemoryError as error:
            rows[str(res)] = dict(error=str(error).splitlines()[0][:300])
        torch.cuda.empty_cache()
    return rows


def call_tensors_mb(call: Callable[[], Any], device: Any) -> float:
    """The peak of the tensors one ``call()`` allocates, over those live before it, in MB (synchronised on a GPU).
    On a GPU torch's caching allocator counts live bytes; on CPU nothing does, so torch's profiler's allocation and
    free events are added up in the order they happened (the ``tensors_mb`` of a cell's fresh process)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    live = top = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):  # allocations and frees in order
        live += event.self_cpu_memory_usage
        top = max(top, live)
    return top / 2**20


def measure_all(encodings: list[str], resolutions: list[int], args: argparse.Namespace,
                saved: Callable[[dict[str, dict[str, Any]]], None]) -> None:
    """Every cell, ``--rounds`` times, interleaved: a fresh process per cell on CPU, one process per encoding's row on
    a GPU; ``saved`` gets the rows (medians over the rounds so far) after each encoding (a killed sweep keeps what it
    measured)."""
    measured: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for round_number in range(1, args.rounds + 1):
        for encoding in encodings:
            cells = gpu_probe(encoding, resolutions, args) if args.device != "cpu" else \
                {str(res): probe(encoding, res, args) for res in resolutions}
            for res in resolutions:
                measured.setdefault(encoding, {}).setdefault(str(res), []).append(row := cells[str(res)])
                tensors = f" ({row['tensors_mb']:7.1f} of tensors)" if row.get("tensors_mb") is not None else ""
                shown = f"{row['peak_mb']:8.1f} MB{tensors} {row['time_s'] * 1e3:9.1f} ms" if "error" not in row \
                    else row["error"]
                which = f"  round {round_number}" if args.rounds > 1 else ""
                print(f"{encoding:16s} {res:5d} px  {shown}{which}", flush=True)
            saved({enc: {res: over_rounds(rounds) for res, rounds in by_res.items()}
                   for enc, by_res in measured.items()})


def over_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell's measurements in each round -> the cell: each number's median, and with more than one round the
    rounds' times and peaks themselves; a round that failed fails the cell."""
    import statistics

    failed = [row for row in rounds if "error" in row]
    if len(rounds) == 1 or failed:
        return (failed or rounds)[0]
    median = lambda key: statistics.median(row[key] for row in rounds)  # noqa: E731
    return dict(peak_mb=median("peak_mb"), first_s=median("first_s"), time_s=median("time_s"),
                tensors_mb=median("tensors_mb") if all(row.get("tensors_mb") for row in rounds) else None,
                round_peak_mb=[row["peak_mb"] for row in rounds], round_time_s=[row["time_s"] for row in rounds])


def probe_environment(args: argparse.Namespace) -> dict[str, str]:
    """A cell's environment: this one, with glibc's mmap threshold fixed where ``--mmap-threshold`` asks."""
    env = dict(os.environ)
    if args.mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    return env


def device_description(args: argparse.Namespace) -> str:
    """What the plot and the tables say the cells ran on."""
    if args.device == "cpu":
        allocator = f", glibc's mmap threshold fixed at {args.mmap_threshold} bytes" \
            if args.mmap_threshold is not None else ""
        return f"CPU float32, {args.threads} threads, each cell a fresh process{allocator}"
    import torch

    dtype = "float32" if gpu_dtype(args) == "float32" else "bfloat16 autocast"
    return f"{torch.cuda.get_device_name(torch.device(args.device))}, {dtype}, torch's allocator peak"


def gpu_dtype(args: argparse.Namespace) -> str:
    """The dtype a GPU measurement runs in: bfloat16 autocast unless float32 is asked for."""
    return "float32" if args.dtype == "float32" else "bfloat16"


def run(args: argparse.Namespace) -> int:
    if args.mmap_threshold is not None and (args.device != "cpu" or args.mmap_threshold < 0):
        raise ValueError(f"--mmap-threshold {args.mmap_threshold}: a byte count >= 0 for --device cpu (glibc's "
                         "allocator; a GPU's memory is torch's caching allocator)")
    if args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds}: at least 1 (each round measures every cell once)")
    if args.device == "cpu" and args.dtype == "bfloat16":
        raise ValueError("--dtype bfloat16 is for --device cuda: each CPU cell runs in float32 (the issue's measure); "
                         "leave --dtype out, or add --device cuda")
    encodings = list_encodings() if args.encodings == "all" else args.encodings.split(",")
    encodings = ["ape"] + [e for e in encodings if e != "ape"]  # the baseline first
    resolutions = [int(r) for r in args.resolutions.split(",")]
    report = dict(provenance=provenance("bench", command="python -m lab memory " + " ".join(sys.argv[2:])),
                  size=args.size, train=args.train, device=device_description(args),
                  flush_denormals=args.device == "cpu", mmap_threshold=args.mmap_threshold,
                  batch_size=args.batch_size if args.train else args.inference_batch_size,
                  repeats=args.repeats, rounds=args.rounds, threads=args.threads, patch=16, resolutions=resolutions)
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)

    def saved(rows: dict[str, dict[str, Any]]) -> None:
        report.update(rows=rows, ratios=ratios(rows, resolutions))
        path.write_text(json.dumps(report, indent=1) + "\n")

    measure_all(encodings, resolutions, args, saved)
    plot(report, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def ratios(rows: dict[str, dict[str, Any]], resolutions: list[int]) -> dict[str, dict[str, Any]]:
    """Each encoding's memory and time over ``ape``'s at every resolution."""
    out: dict[str, dict[str, Any]] = {}
    for encoding, by_res in rows.items():
        out[encoding] = {}
        for res in map(str, resolutions):
            mine, base = by_res.get(res, {}), rows["ape"].get(res, {})
            if "peak_mb" in mine and "peak_mb" in base and base["peak_mb"] > 0:
                out[encoding][res] = dict(memory=mine["peak_mb"] / base["peak_mb"],
                                          tensors=mine["tensors_mb"] / base["tensors_mb"]
                                          if mine.get("tensors_mb") and base.get("tensors_mb") else None,
                                          time=mine["time_s"] / base["time_s"])
    return out


def growth(by_res: dict[str, Any], resolutions: list[int], patch: int = 16, key: str = "peak_mb") -> float | None:
    """The exponent of memory (or another measure, ``key``) against tokens between the smallest and largest
    resolution (log-log slope)."""
    import math

    ends = [str(resolutions[0]), str(resolutions[-1])]
    if len(set(ends)) < 2 or not all(key in by_res.get(r, {}) and by_res[r][key] > 0 for r in ends):
        return None
    tokens = [(int(r) // patch) ** 2 + 1 for r in ends]
    return math.log(by_res[ends[1]][key] / by_res[ends[0]][key]) / math.log(tokens[1] / tokens[0])


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    cmap = plt.get_cmap("tab20")
    for i, (encoding, by_res) in enumerate(report["rows"].items()):
        points = [((int(r) // report["patch"]) ** 2 + 1, v) for r, v in by_res.items() if "peak_mb" in v]
        if not points:
            continue
        tokens = [t for t, _ in points]
        style = dict(color="black", lw=2.2) if encoding == "ape" else dict(color=cmap(i % 20), lw=1.1)
        axes[0].plot(tokens, [v["peak_mb"] for _, v in points], marker="o", ms=3, label=encoding, **style)
        axes[1].plot(tokens, [v["time_s"] * 1000 for _, v in points], marker="o", ms=3, **style)
    what = "training step" if report["train"] else "inference"
    for ax, label in zip(axes, ("peak memory of one call (MB)", "time of one call (ms)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens (log)")
        ax.set_ylabel(label + " (log)")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, ncol=2)
    where = report.get("device", "CPU float32, each point a fresh process")
    fig.suptitle(f"ViT-{report['size'].upper()}/16 {what}, batch {report['batch_size']}, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
