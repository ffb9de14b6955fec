"""Where a measured number comes from: the commit, and a fingerprint of the behaviour that can change it.

Every results JSON the lab writes carries :func:`provenance`. Its ``behaviour`` is what the code *does* on fixed,
tiny inputs (:func:`behaviour`): every encoding's logits in float64 on a small image model (two sizes, with and
without position interpolation) and, for video encodings, a small video model; and, for results that come from
training, a few epochs of the real training loop on each generated task and on digits, with the evaluation sweep of
the trained checkpoint. Every weight of these models is filled from a generator seeded by its name
(:func:`fill_by_name`), so the probes measure the forward and the loop, not the order of the init's random draws. A
pure refactor - reordering how parameters are created included - leaves these numbers unchanged, so every result
stays current; a numerical change moves them and ``python -m lab report --check`` names the results to re-run.
Numbers are compared with a relative tolerance (:data:`TOLERANCE`), far above the reordering noise of float
arithmetic and far below any change of method, data or recipe.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from unittest.mock import patch

from pape_hub.records import git_commit

__all__ = ["RESULT_PROBES", "TOLERANCE", "behaviour", "behaviour_differences", "decode_behaviour", "encode_behaviour",
           "git_commit", "provenance"]

#: the behaviour probes behind each kind of result
RESULT_PROBES: dict[str, tuple[str, ...]] = {
    "arrows": ("models", "training"),
    "compare": ("models", "training"),
    "bench": ("models",),
    "profile": ("models",),
    "modalities": ("models", "free_tokens", "free_training"),
}
TOLERANCE = dict(rel=1e-4, abs=1e-6)
_TINY = dict(embed_dim=32, depth=2, num_heads=2)


def _numbers(t: Any) -> list[float]:
    return [round(float(v), 10) for v in t.detach().double().flatten().tolist()]


def _name_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def random_buffers(build: Callable[[], Any]) -> set[str]:
    """The floating-point buffers a model's init draws at random (PaPE-RI's fixed per-head scale): those that differ
    between two builds under different seeds. The others (RoPE frequencies, ALiBi slopes) are functions of the
    configuration and keep their values, so the probes still see them."""
    import torch

    torch.manual_seed(0)
    first = dict(build().named_buffers())
    torch.manual_seed(1)
    second = dict(build().named_buffers())
    return {name for name, t in first.items() if t.is_floating_point() and not torch.equal(t, second[name])}


#: the scale of the filled weights: half of unit variance keeps attention far from uniform (every encoding moves the
#: logits) yet PaPE's 50 parabolas short of attending to each token alone (then positions would not matter)
WEIGHT_SCALE = 0.5


def fill_by_name(model: Any, buffers: set[str] = frozenset()) -> Any:
    """Overwrite every floating-point parameter (and the named ``buffers``) with draws from a generator seeded by the
    tensor's own name: normalisation gains 1 + 0.1 z, biases 0.1 z, every other tensor
    :data:`WEIGHT_SCALE` z / sqrt(its last dimension). The probes
    then fingerprint what the model computes, not the order in which its constructor drew its init: creating
    parameters in another order, or an init that draws more or fewer numbers, leaves every probe as it was."""
    import torch

    gains = {f"{name}.weight" if name else "weight" for name, m in model.named_modules()
             if hasattr(m, "normalized_shape")}  # LayerNorm and its kin
    tensors = {**dict(model.named_parameters()), **{n: b for n, b in model.named_buffers() if n in buffers}}
    with torch.no_grad():
        for name, t in tensors.items():
            if not t.is_floating_point():
                continue
            z = torch.randn(t.shape, generator=torch.Generator().manual_seed(_name_seed(name)), dtype=torch.float64)
            if name in gains:
                t.copy_(1 + 0.1 * z)
            elif name.endswith("bias"):
                t.copy_(0.1 * z)
            else:
                t.copy_(z * WEIGHT_SCALE / math.sqrt(t.shape[-1] if t.ndim else 1))
    return model


def _probe_models() -> dict[str, list[float]]:
    """Every encoding's float64 logits on a tiny ViT (32 px and 48 px, with and without interpolation) and, where
    the encoding is defined in 3-D, on a tiny ViViT; every weight filled by name (:func:`fill_by_name`)."""
    import timm
    import torch

    from pape_hub.encodings import encoding_class, list_encodings

    def filled(name: str, **kwargs: Any) -> Any:
        def build() -> Any:
            return timm.create_model(name, num_classes=3, **_TINY, **kwargs)

        return fill_by_name(build().double().eval(), random_buffers(build))

    out: dict[str, list[float]] = {}
    for enc in list_encodings():
        model = filled(f"vit_t4_{enc}")
        x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        with torch.no_grad():
            values = [model(x[..., :32, :32]), model(x), model.forward_head(model.forward_features(x, True))]
        out[f"vit/{enc}"] = [v for t in values for v in _numbers(t)]
        if 3 in encoding_class(enc)[0].supported_ndims:
            video = filled(f"vivit_t16_{enc}", img_size=32, num_frames=4)
            clip = torch.randn(1, 3, 4, 32, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
            with torch.no_grad():
                out[f"vivit/{enc}"] = _numbers(video(clip))
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


def _filled_build_model(build: Callable[..., Any]) -> Callable[..., Any]:
    """The training loop's ``build_model`` with every weight filled by name, and the global random state reset to
    the run's seed afterwards: augmentation and drop path then draw the same numbers however many the init drew."""
    import torch

    def build_model(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        model = fill_by_name(build(cfg, *args, **kwargs), random_buffers(lambda: build(cfg, *args, **kwargs)))
        torch.manual_seed(cfg.seed)
        return model

    return build_model


def _probe_training() -> dict[str, list[float]]:
    """A few epochs of the real training loop per task (losses, accuracies) from weights filled by name, and the
    evaluation sweep of the arrow run's best checkpoint."""
    import torch

    from pape_hub.evaluation import evaluate_checkpoint
    from pape_hub.training import TrainConfig, loop, train

    out: dict[str, list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order on every machine of the kind
    try:
        with tempfile.TemporaryDirectory(prefix="pape_hub_probe_") as tmp, \
                patch.object(loop, "build_model", _filled_build_model(loop.build_model)):
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


def _probe_free_tokens() -> dict[str, list[float]]:
    """Every free-coordinate encoding's float64 logits on a tiny point model (both stems) and a tiny event model,
    every weight filled by name, on fixed inputs with padding."""
    import timm
    import torch

    from pape_hub.models.free_tokens import free_coordinate_encodings

    generator = torch.Generator().manual_seed(4)
    points = torch.randn(2, 40, 3, generator=generator, dtype=torch.float64) * 0.5
    events = torch.cat([torch.randint(0, 16, (2, 60, 2), generator=generator).double(),
                        torch.rand(2, 60, 1, generator=generator, dtype=torch.float64) * 100,
                        torch.randint(0, 2, (2, 60, 1), generator=generator).double()], dim=-1)
    valid = torch.ones(2, 60, dtype=torch.bool)
    valid[1, 45:] = False
    out: dict[str, list[float]] = {}
    for enc in free_coordinate_encodings():
        models = {
            "points": (dict(num_groups=8, group_size=6), points, valid[:, :40]),
            "points_invariant": (dict(num_groups=8, group_size=6, rotation_invariant_groups=True), points,
                                 valid[:, :40]),
            "events": (dict(sensor_size=[16, 16], event_patch_size=4, threshold=3, time_scale=10.0,
                            nominal_duration=100.0), events, valid)}
        for name, (kwargs, x, mask) in models.items():
            family = "pointvit" if name.startswith("points") else "eventvit"

            def build(family: str = family, kwargs: dict[str, Any] = kwargs, enc: str = enc) -> Any:
                return timm.create_model(f"{family}_m_{enc}", num_classes=3, **_TINY, **kwargs)

            model = fill_by_name(build().double().eval(), random_buffers(build))
            with torch.no_grad():
                out[f"{name}/{enc}"] = _numbers(model(x, mask))
    return out


_FREE_TRAINING_RUNS: dict[str, dict[str, Any]] = {
    "shapes3d": dict(model="pointvit_m_pape_ri", model_kwargs=dict(_TINY, num_groups=8, group_size=8),
                     dataset="shapes3d", shapes=dict(points=64, min_points=32), epochs=1, batch_size=16,
                     train_size=48, eval_size=16),
    "movingdot": dict(model="eventvit_m_rope", model_kwargs=dict(_TINY, sensor_size=[32, 32], event_patch_size=8,
                                                                 threshold=8, time_scale=25_000.0),
                      dataset="movingdot", events=dict(steps=24), epochs=1, batch_size=16, train_size=48,
                      eval_size=16),
}


def _probe_free_training() -> dict[str, list[float]]:
    """An epoch of the real training loop on each generated point and event task from weights filled by name."""
    import torch

    from pape_hub.training import TrainConfig, loop, train

    out: dict[str, list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="pape_hub_probe_") as tmp, \
                patch.object(loop, "build_model", _filled_build_model(loop.build_model)):
            for name, fields in _FREE_TRAINING_RUNS.items():
                result = train(TrainConfig(**fields, output_dir=str(Path(tmp) / name), quiet=True, seed=3))
                out[f"train/{name}"] = [v for h in result["history"] for v in
                                        (h["train_loss"], h["val_loss"], h["val_top1"])] + \
                    [result["test"]["loss"], result["test"]["top1"]]
    finally:
        torch.set_num_threads(threads)
    return out


_PROBES = {"models": _probe_models, "training": _probe_training, "free_tokens": _probe_free_tokens,
           "free_training": _probe_free_training}


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
    ``python -m lab`` with ``argv``, quoted as a shell reads it: an empty argument stays one)."""
    import timm
    import torch

    values = behaviour(kind)
    return dict(kind=kind, behaviour_fingerprint=behaviour_digest(values), behaviour=encode_behaviour(values),
                commit=os.environ.get("PAPE_HUB_LAB_COMMIT") or git_commit(),  # set where the tree travels without .git
                command=command or "python -m lab " + shlex.join(argv if argv is not None else sys.argv[1:]),
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
