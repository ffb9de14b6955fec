r"""Every encoding that takes free 3-D coordinates, on the two generated tasks off the pixel grid, over seeds: the
3-D shapes (point clouds; trained in their canonical pose, tested in random poses and at other point counts) and the
moving dot (event streams; the class lies in the timing; tested at other speeds and with half the events). Writes a
table over seeds (mean and a bootstrap interval), a plot, and a checkpoint with a model card per encoding, pushed to a
Hub and loaded back by repo id.

``shapes3d``: ``pointvit_m_*`` (width 96, depth 4, 4 heads, average pooling) on 32 groups of 16 points described by
what a rotation keeps (``rotation_invariant_groups``), so that a rotation-invariant encoding makes the whole model
rotation invariant and the position encoding alone decides how a model fares in a new pose; clouds of 128 to 256
points; evaluated at 256, 128 and 512 points, each canonical and rotated (and shifted). ``movingdot``:
``eventvit_m_*`` on a 32 x 32 sensor in 4-px cells firing every 8 events, one time unit an eighth of a crossing;
trained at speed 1 on 1,024 streams an epoch that start at random times; evaluated at speeds 1, 0.5 and 2 and with
half the events. LieRE's two encodings are left out by default: 16 times the others' training time here (``ENCODINGS``).

Examples:
    python -m lab modalities --task shapes3d                 # results/modalities_shapes3d
    python -m lab modalities --task movingdot                # results/modalities_movingdot
    python -m lab modalities --task shapes3d --encodings pape_ri,rope_mixed --seeds 0 --results-dir none --hub none
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import REPOSITORY
from ..experiment import add_comparison_arguments, compare_encodings
from .arrows import publish

#: the encodings that take free 3-D coordinates but LieRE's two (`--encodings all` adds them): every point group and
#: every spiking patch sits at its own coordinate, so each token needs its own matrix exponentials, forward and
#: backward. Measured here, LieRE-8 takes about 3 min an epoch where the others take 0.2 (shapes) to 0.5 (events):
#: 25 min a run, 16 times the others' (issue 37 names the cost); dense LieRE more
ENCODINGS = "none,sincos,alibi,pape,pape_ri,rope,rope_mixed,polar_rope"
SMALL = dict(embed_dim=96, depth=4, num_heads=4, global_pool="avg", class_token=False)
TASKS: dict[str, dict[str, Any]] = {
    "shapes3d": dict(
        model="pointvit_m_{encoding}", setting_field="shapes", setting=dict(points=256, min_points=128),
        model_kwargs=dict(SMALL, num_groups=32, group_size=16, rotation_invariant_groups=True),
        sizes=[256, 128, 512], labels=lambda sizes: [label for n in sizes for label in (f"{n}", f"{n} rotated")],
        unit="at", repo="pointvit-shapes3d-"),
    "movingdot": dict(
        model="eventvit_m_{encoding}", setting_field="events", setting=dict(),
        model_kwargs=dict(SMALL, sensor_size=[32, 32], event_patch_size=4, threshold=8, time_scale=12_500.0,
                          nominal_duration=100_000.0, max_tokens=256),
        sizes=[1.0, 0.5, 2.0],
        labels=lambda sizes: [f"speed {v:g}" for v in sizes] + [f"speed {sizes[0]:g}, half the events"],
        unit="at", repo="eventvit-movingdot-", preset=dict(train_size=1024)),
}
PRESET = dict(epochs=8, train_size=2048, eval_size=500, batch_size=64, lr=1e-3, warmup_epochs=1, weight_decay=0.05,
              label_smoothing=0.0, drop_path=0.0, recipe="default")
FLAGS = ("epochs", "train_size", "eval_size", "batch_size", "lr")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=sorted(TASKS), required=True, help="the generated task")
    add_comparison_arguments(parser, seeds="0,1,2,3,4", train_settings=FLAGS,
                             output_dir="outputs/modalities_<task>", results_dir="results/modalities_<task>")
    parser.set_defaults(encodings=ENCODINGS)
    parser.add_argument("--hub", choices=["auto", "local", "real", "none"], default="auto",
                        help="where the seed-0 checkpoints are pushed and loaded back from (as python -m lab arrows)")
    parser.add_argument("--hub-namespace", default="pape-hub", help="user or organisation of the pushed repos")


def run(args: argparse.Namespace) -> int:
    from pape_hub.models.free_tokens import free_coordinate_encodings

    task = TASKS[args.task]
    if args.encodings == "all":
        args.encodings = ",".join(free_coordinate_encodings())
    preset = {**PRESET, **task.get("preset", {}),  # the task's own budget, then the flags given
              **{k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}}
    results = args.results_dir or str(REPOSITORY / "results" / f"modalities_{args.task}")
    results_dir = None if results == "none" else Path(results)
    output_dir = Path(args.output_dir or f"outputs/modalities_{args.task}")
    hub = None
    if args.hub != "none":
        from ..publish import HubTarget

        hub = HubTarget.resolve(args.hub, args.hub_namespace)
    train = dict(preset, model=task["model"], model_kwargs=task["model_kwargs"], dataset=args.task,
                 quiet=False, overwrite=True, **{task["setting_field"]: task["setting"]})
    labels = task["labels"](task["sizes"])
    facts = dict(task=dict(name=args.task, **task["setting"]), model=task["model_kwargs"],
                 recipe={k: v for k, v in train.items() if k not in ("model", "model_kwargs")},
                 epochs=preset["epochs"], train_size=preset["train_size"], eval_size=preset["eval_size"])
    sweep = dict(dataset=args.task, sizes=task["sizes"], eval_size=preset["eval_size"])
    title = (f"{args.task}: trained at {labels[0]}" + (" points, canonical pose" if args.task == "shapes3d" else ""))
    return compare_encodings(args, "modalities", train, sweep, labels, task["unit"], output_dir,
                             results_dir, title, facts,
                             publish=None if hub is None else lambda summary: publish(summary, hub, None,
                                                                                      task["repo"]))
