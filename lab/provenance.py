"""Where a measured number comes from: the commit, and a fingerprint of the behaviour that can change it.

Every results JSON the project writes carries :func:`provenance`. Its ``behaviour`` is what the code *does* on
fixed, tiny inputs (:func:`behaviour`): every encoding's logits in float64 on a small image model (two sizes, with
and without position interpolation) and, for video encodings, a small video model; and, for results that come
from training, a few epochs of the real training loop on each generated task and on digits, with the evaluation
sweep of the trained checkpoint. A pure refactor leaves these numbers unchanged, so every result stays current;
a numerical change moves them and ``python -m lab report --check`` names the results to re-run. Numbers are compared
with a relative tolerance (:data:`TOLERANCE`), far above the reordering noise of float arithmetic and far below
any change of method, initialisation order, data or recipe.
"""

from __future__ import annotations

import hashlib
import math
import platform
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Any

from pape_hub.records import git_commit

__all__ = ["RESULT_PROBES", "TOLERANCE", "behaviour", "behaviour_differences", "decode_behaviour", "encode_behaviour",
           "git_commit", "provenance"]

#: the behaviour probes behind each kind of result
RESULT_PROBES: dict[str, tuple[str, ...]] = {
    "arrows": ("models", "training"),
    "compare": ("models", "training"),
    "bench": ("models",),
    "profile": ("models",),
}
TOLERANCE = dict(rel=1e-4, abs=1e-6)
_TINY = dict(embed_dim=32, depth=2, num_heads=2)


def _numbers(t: Any) -> list[float]:
    return [round(float(v), 10) for v in t.detach().double().flatten().tolist()]


def _probe_models() -> dict[str, list[float]]:
    """Every encoding's float64 logits on a tiny ViT (32 px and 48 px, with and without interpolation) and, where
    the encoding is defined in 3-D, on a tiny ViViT."""
    import timm
    import torch

    from pape_hub.encodings import encoding_class, list_encodings

    out: dict[str, list[float]] = {}
    for enc in list_encodings():
        torch.manual_seed(0)
        model = timm.create_model(f"vit_t4_{enc}", num_classes=3, **_TINY).double().eval()
        x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        with torch.no_grad():
            values = [model(x[..., :32, :32]), model(x), model.forward_head(model.forward_features(x, True))]
        out[f"vit/{enc}"] = [v for t in values for v in _numbers(t)]
        if 3 in encoding_class(enc)[0].supported_ndims:
            torch.manual_seed(0)
            video = timm.create_model(f"vivit_t16_{enc}", num_classes=3, img_size=32, num_frames=4, **_TINY)
            clip = torch.randn(1, 3, 4, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            with torch.no_grad():
                out[f"vivit/{enc}"] = _numbers(video.double().eval()(clip))
    return out


_TRAINING_RUNS: dict[str, dict[str, Any]] = {
    "arrows": dict(model="vit_t4_pape", model_kwargs=dict(_TINY, patch_size=12, global_pool="avg",
                                                          class_token=False),
                   dataset="arrows", epochs=2, batch_size=16, train_size=64, eval_size=32, label_smoothing=0.0,
                   drop_path=0.0),
    "digits": dict(model="vit_t4_rope_mixed", model_kwargs=dict(_TINY, patch_size=2, in_chans=1), img_size=16,
                   dataset="digits", epochs=1, batch_size=128, aug="light"),
    "motion": dict(model="vivit_t16_liere8", model_kwargs=dict(_TINY, tubelet_size=[2, 8, 8], global_pool="avg",
                                                               class_token=False),
                   dataset="motion", epochs=1, batch_size=16, train_size=32, eval_size=16),
}


def _probe_training() -> dict[str, list[float]]:
    """A few epochs of the real training loop per task (losses, accuracies), and the evaluation sweep of the
    arrow run's best checkpoint."""
    import torch

    from pape_hub.evaluation import evaluate_checkpoint
    from pape_hub.training import TrainConfig, train

    out: dict[str, list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order on every machine of the kind
    try:
        with tempfile.TemporaryDirectory(prefix="pape_hub_probe_") as tmp:
            for name, fields in _TRAINING_RUNS.items():
                folder = Path(tmp) / name
                result = train(TrainConfig(**fields, output_dir=str(folder), quiet=True, seed=3))
                out[f"train/{name}"] = [v for h in result["history"] for v in
                                        (h["train_loss"], h["val_loss"], h["val_top1"])] + \
                    [result["test"]["loss"], result["test"]["top1"]]
            sweep = evaluate_checkpoint(Path(tmp) / "arrows" / "best", "arrows", sizes=[4, 5], eval_size=32,
                                        progress=False)
            out["eval/arrows"] = [v for row in sweep.rows for v in (row.loss, row.top1)]
    finally:
        torch.set_num_threads(threads)
    return out


_PROBES = {"models": _probe_models, "training": _probe_training}


@cache
def _probe(name: str) -> dict[str, list[float]]:
    return _PROBES[name]()


def behaviour(kind: str) -> dict[str, list[float]]:
    """What the code behind results of ``kind`` computes on the fixed probes (seconds for models, about a minute
    with training; computed once per process)."""
    if kind not in RESULT_PROBES:
        raise ValueError(f"unknown result kind {kind!r}; known: {sorted(RESULT_PROBES)}")
    return {key: values for probe in RESULT_PROBES[kind] for key, values in _probe(probe).items()}


def behaviour_digest(values: dict[str, list[float]]) -> str:
    """A short name for a behaviour record (shown in the README; the comparison uses the numbers)."""
    text = ";".join(f"{k}:" + ",".join(f"{v:.4g}" for v in values[k]) for k in sorted(values))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_behaviour(values: dict[str, list[float]]) -> dict[str, str]:
    """The record as a results file stores it: one line of numbers per probe."""
    return {key: " ".join(f"{v:.10g}" for v in numbers) for key, numbers in values.items()}


def decode_behaviour(record: dict[str, str]) -> dict[str, list[float]]:
    return {key: [float(v) for v in text.split()] for key, text in record.items()}


def behaviour_differences(recorded: dict[str, list[float]], current: dict[str, list[float]]) -> list[str]:
    """The probes whose numbers differ beyond :data:`TOLERANCE`, or that today's code no longer has. A probe the
    recorded side lacks is new (an encoding or task added since): the result never ran that code, so it is no
    difference, and adding an encoding keeps every earlier result current."""
    problems = [f"{k}: no longer probed" for k in sorted(set(recorded) - set(current))]
    for key in sorted(set(recorded) & set(current)):
        a, b = recorded[key], current[key]
        if len(a) != len(b) or not all(_close(x, y) for x, y in zip(a, b)):
            worst = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
            problems.append(f"{key}: {len(a)} -> {len(b)} numbers, largest difference {worst:.3g}")
    return problems


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=TOLERANCE["rel"], abs_tol=TOLERANCE["abs"])


def provenance(kind: str, argv: list[str] | None = None, command: str | None = None) -> dict[str, Any]:
    """What a results file records about the run that wrote it (``command``: a script's own command line, else
    ``pape-hub`` with ``argv``)."""
    import timm
    import torch

    values = behaviour(kind)
    return dict(kind=kind, behaviour_fingerprint=behaviour_digest(values), behaviour=encode_behaviour(values),
                commit=git_commit(),
                command=command or "pape-hub " + " ".join(argv if argv is not None else sys.argv[1:]),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), python=platform.python_version(),
                torch=torch.__version__, timm=timm.__version__, machine=f"{platform.machine()}, "
                f"{torch.get_num_threads()} torch threads", cpu=cpu_description())


def cpu_description() -> str:
    """The CPU model and the instruction set torch's CPU kernels dispatch to: results that train rotary or LieRE
    models reproduce bit for bit on one machine and thread count, but kernels chosen per instruction set round
    differently, so another CPU can move single runs."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, torch kernels {torch.backends.cpu.get_cpu_capability()}"
