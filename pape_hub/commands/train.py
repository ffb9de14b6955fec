r"""``pape-hub train``: train any registered model on the arrow task or a real image dataset (accelerate).

Examples:
    pape-hub train --model vit_t4_rope_mixed --model-kwargs '{"patch_size": 12, "embed_dim": 96, "depth": 4,
        "num_heads": 4, "global_pool": "avg", "class_token": false}' --dataset arrows --output-dir outputs/rm
    pape-hub train --model vit_t4_pape --dataset digits --img-size 16 --aug none \
        --model-kwargs '{"patch_size": 2, "in_chans": 1}' --output-dir outputs/digits_pape
    pape-hub train --model vivit_t16_rope --dataset motion --model-kwargs '{"tubelet_size": [2, 8, 8],
        "embed_dim": 96, "depth": 4, "num_heads": 4}' --train-size 4096 --output-dir outputs/motion_rope
    accelerate launch scripts/train.py --model vit_s16_pape --dataset imagefolder:/data/imagenet --epochs 300
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..data import DATASET_SPECS, DIGITS_INPUT, ArrowConfig, MotionConfig
from ..recipes import AUGMENTATION_PRESETS, RECIPES, setting_help
from ..training import TrainConfig, train

MOTION_FLAGS = {"motion_frames": "frames", "motion_grid": "grid", "motion_cell": "cell",
                "motion_distractors": "distractors", "motion_tubelet_frames": "tubelet_frames"}
ARROW_FLAGS = {"arrow_grid": "grid", "arrow_cell": "cell", "arrow_arrows": "num_arrows",
               "arrow_letters": "num_letters", "arrow_hard_negatives": "hard_negatives", "arrow_isolated": "isolated"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument("--model", default=d.model, help="a registered model name (pape_hub.list_pape_models())")
    parser.add_argument("--model-kwargs", default="{}", help="JSON object of extra model constructor arguments "
                        '(e.g. {"in_chans": 1} for grey images)')
    parser.add_argument("--dataset", default=d.dataset, help=DATASET_SPECS)
    parser.add_argument("--output-dir", default=d.output_dir)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    parser.add_argument("--recipe", choices=list(RECIPES), default=d.recipe,
                        help="init, weight-decay groups, schedule and the settings below a source states "
                        "(pape_hub.recipes); a setting given explicitly wins: "
                        + "; ".join(f"{r.name}: {r.source}" for r in RECIPES.values()))
    parser.add_argument("--min-lr", type=float, default=None, help="end of the schedule; " + setting_help("min_lr"))
    parser.add_argument("--weight-decay", type=float, default=None, help=setting_help("weight_decay"))
    parser.add_argument("--warmup-epochs", type=float, default=None, help=setting_help("warmup_epochs"))
    parser.add_argument("--label-smoothing", type=float, default=None, help=setting_help("label_smoothing"))
    parser.add_argument("--drop-path", type=float, default=None, help=setting_help("drop_path"))
    parser.add_argument("--aug", choices=list(AUGMENTATION_PRESETS), default=None,
                        help="augmentation preset for natural images; the flags below override its parts ("
                        + "; ".join(f"{k}: {v}" for k, v in AUGMENTATION_PRESETS.items()) + "); "
                        + setting_help("aug"))
    parser.add_argument("--crop-scale", type=floats, default=None, metavar="MIN,MAX",
                        help="random-resized-crop area range (default: the preset's)")
    parser.add_argument("--crop-padding", type=int, default=None,
                        help="pad by this much, then a random crop of the image size (default: the preset's)")
    parser.add_argument("--hflip", type=float, default=None, help="horizontal flip probability (default: preset)")
    parser.add_argument("--color-jitter", type=float, default=None, help="colour jitter strength (default: preset)")
    parser.add_argument("--randaugment", default=None, help="timm auto_augment string, '' for none (default: preset)")
    parser.add_argument("--mixup", type=float, default=None, help="Mixup alpha, 0 for none (default: preset)")
    parser.add_argument("--cutmix", type=float, default=None, help="CutMix alpha, 0 for none (default: preset)")
    parser.add_argument("--normalize", choices=["dataset", "model"], default=d.normalize,
                        help="normalise pixels with the training split's mean/std or the model's pretrained_cfg")
    parser.add_argument("--grad-accum", type=int, default=d.grad_accum)
    parser.add_argument("--clip-grad", type=float, default=None, help="max grad norm, 0 for none; "
                        + setting_help("clip_grad"))
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default=d.mixed_precision)
    parser.add_argument("--resume", default=None, help="an output dir (or its state/) to continue exactly")
    parser.add_argument("--init-from", default=None, metavar="CHECKPOINT|NAME.TAG",
                        help="seed the model from a checkpoint folder or a converted public checkpoint "
                        "(pape_hub.list_pretrained()): every non-positional weight, the encoding's own where it is the "
                        "same, the head where the classes agree; the model's own init for the rest")
    parser.add_argument("--allow-changed-hparams", action="store_true",
                        help="let --resume continue with hyper-parameters other than the saved run's")
    parser.add_argument("--overwrite", action="store_true", help="replace what an earlier run left in --output-dir")
    parser.add_argument("--stop-after-epoch", type=int, default=None,
                        help="stop after this many epochs (the schedule still spans --epochs); --resume later")
    parser.add_argument("--push-to-hub", default=None, metavar="ORG/NAME", help="push the best checkpoint")
    parser.add_argument("--num-workers", type=int, default=d.num_workers)
    parser.add_argument("--img-size", type=int, default=None, help="image size (default: the model's)")
    parser.add_argument("--val-fraction", type=float, default=d.val_fraction)
    parser.add_argument("--train-size", type=int, default=d.train_size, help="arrow task: samples per epoch")
    parser.add_argument("--eval-size", type=int, default=d.eval_size, help="arrow task: val/test samples")
    arrow = ArrowConfig()
    parser.add_argument("--arrow-grid", type=int, default=arrow.grid, help="arrow task: cells per side")
    parser.add_argument("--arrow-cell", type=int, default=arrow.cell, help="arrow task: cell size in pixels")
    parser.add_argument("--arrow-arrows", type=int, default=arrow.num_arrows, help="arrow task: arrows per image")
    parser.add_argument("--arrow-letters", type=int, default=arrow.num_letters, help="arrow task: distractor letters")
    parser.add_argument("--arrow-hard-negatives", type=int, default=arrow.hard_negatives,
                        help="arrow task: distractor arrows next to the Y")
    parser.add_argument("--arrow-isolated", action="store_true",
                        help="arrow task control: no distractor arrow next to the Y (direction not needed)")
    motion = MotionConfig()
    parser.add_argument("--motion-frames", type=int, default=motion.frames, help="motion task: frames per clip")
    parser.add_argument("--motion-grid", type=int, default=motion.grid, help="motion task: cells per side")
    parser.add_argument("--motion-cell", type=int, default=motion.cell, help="motion task: cell size in pixels")
    parser.add_argument("--motion-distractors", type=int, default=motion.distractors,
                        help="motion task: squares that stand still")
    parser.add_argument("--motion-tubelet-frames", type=int, default=motion.tubelet_frames,
                        help="motion task: frames per time step (the model's tubelet length)")
    parser.add_argument("--num-frames", type=int, default=None,
                        help="video folders: frames sampled per clip (default: the model's)")
    parser.add_argument("--image-column", default=d.image_column, help="hf datasets: image column")
    parser.add_argument("--label-column", default=d.label_column, help="hf datasets: label column")
    parser.add_argument("--log-with", default=None, help="accelerate tracker: tensorboard, wandb, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--keep-denormals", action="store_true",
                        help="on CPU, keep subnormal floats (by default they are flushed to zero: PaPE trains ~3x "
                        "faster)")
    parser.add_argument("--quiet", action="store_true")


def floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from err


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    try:
        model_kwargs = json.loads(args.model_kwargs)
    except json.JSONDecodeError as err:
        raise ValueError(f"--model-kwargs is not valid JSON: {err}") from err
    if not isinstance(model_kwargs, dict):
        raise ValueError("--model-kwargs must be a JSON object")
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if args.dataset == "digits":  # what digits need to be learned at all, where not given
        values.update({k: v for k, v in DIGITS_INPUT.items() if k != "model_kwargs" and values.get(k) is None})
        model_kwargs = {**DIGITS_INPUT["model_kwargs"], **model_kwargs}
    values.update(model_kwargs=model_kwargs,
                  arrow={field: getattr(args, flag) for flag, field in ARROW_FLAGS.items()},
                  motion={field: getattr(args, flag) for flag, field in MOTION_FLAGS.items()},
                  flush_denormals=not args.keep_denormals)
    return TrainConfig(**values)


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    if args.dataset == "digits" and not args.quiet:
        print(f"digits: {cfg.img_size} px, aug {cfg.aug!r}, model arguments {cfg.model_kwargs} (the digits input of "
              "the README's table; --img-size, --aug and --model-kwargs change it), recipe "
              f"{cfg.recipe!r}: {cfg.epochs} epochs at batch {cfg.batch_size}, lr {cfg.lr}. The table's models "
              "(`pape-hub compare --dataset digits`: width 96, depth 4, 30 epochs at batch 64, lr 1e-3, warm-up 3) "
              "pass 0.3 validation top-1 after 3 to 7 epochs (results/digits/summary.json)", flush=True)
    results = train(cfg)
    if not args.quiet and results["is_main_process"]:
        test = results.get("test")
        print(f"best val top-1 {results['best_val_top1']:.4f} (epoch {results['best_epoch'] + 1})"
              + (f", test top-1 {test['top1']:.4f}" if test else "") + f"; outputs in {results['output_dir']}")
    return 0
