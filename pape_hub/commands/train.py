"""``pape-hub train``: train any registered model on the arrow task or a real image dataset (accelerate).

Examples:
    pape-hub train --model vit_t4_rope_mixed --model-kwargs '{"patch_size": 12, "embed_dim": 96, "depth": 4,
        "num_heads": 4, "global_pool": "avg", "class_token": false}' --dataset arrows --output-dir outputs/rm
    accelerate launch scripts/train.py --model vit_s16_pape --dataset imagefolder:/data/imagenet --epochs 300
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..training import TrainConfig, train

ARROW_FLAGS = {"arrow_grid": "grid", "arrow_cell": "cell", "arrow_arrows": "num_arrows",
               "arrow_letters": "num_letters", "arrow_hard_negatives": "hard_negatives"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument("--model", default=d.model, help="a registered model name (pape_hub.list_pape_models())")
    parser.add_argument("--model-kwargs", default="{}", help="JSON object of extra model constructor arguments")
    parser.add_argument("--dataset", default=d.dataset, help="arrows | imagefolder:PATH | hf:NAME | cifar:PATH")
    parser.add_argument("--output-dir", default=d.output_dir)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--min-lr", type=float, default=d.min_lr)
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay)
    parser.add_argument("--warmup-epochs", type=float, default=d.warmup_epochs)
    parser.add_argument("--label-smoothing", type=float, default=d.label_smoothing)
    parser.add_argument("--drop-path", type=float, default=d.drop_path)
    parser.add_argument("--mixup", type=float, default=d.mixup, help="Mixup alpha (natural images only)")
    parser.add_argument("--cutmix", type=float, default=d.cutmix, help="CutMix alpha (natural images only)")
    parser.add_argument("--randaugment", default=d.randaugment, help="timm auto_augment string, '' for none")
    parser.add_argument("--grad-accum", type=int, default=d.grad_accum)
    parser.add_argument("--clip-grad", type=float, default=d.clip_grad, help="max grad norm, 0 to disable")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default=d.mixed_precision)
    parser.add_argument("--resume", default=None, help="an output dir (or its state/) to continue exactly")
    parser.add_argument("--stop-after-epoch", type=int, default=None,
                        help="stop after this many epochs (the schedule still spans --epochs); --resume later")
    parser.add_argument("--push-to-hub", default=None, metavar="ORG/NAME", help="push the best checkpoint")
    parser.add_argument("--num-workers", type=int, default=d.num_workers)
    parser.add_argument("--img-size", type=int, default=None, help="image size (default: the model's)")
    parser.add_argument("--val-fraction", type=float, default=d.val_fraction)
    parser.add_argument("--train-size", type=int, default=d.train_size, help="arrow task: samples per epoch")
    parser.add_argument("--eval-size", type=int, default=d.eval_size, help="arrow task: val/test samples")
    parser.add_argument("--arrow-grid", type=int, default=4)
    parser.add_argument("--arrow-cell", type=int, default=12)
    parser.add_argument("--arrow-arrows", type=int, default=4)
    parser.add_argument("--arrow-letters", type=int, default=0)
    parser.add_argument("--arrow-hard-negatives", type=int, default=0)
    parser.add_argument("--image-column", default=d.image_column, help="hf datasets: image column")
    parser.add_argument("--label-column", default=d.label_column, help="hf datasets: label column")
    parser.add_argument("--log-with", default=None, help="accelerate tracker: tensorboard, wandb, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quiet", action="store_true")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    try:
        model_kwargs = json.loads(args.model_kwargs)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--model-kwargs is not valid JSON: {err}") from err
    if not isinstance(model_kwargs, dict):
        raise SystemExit("--model-kwargs must be a JSON object")
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(model_kwargs=model_kwargs, clip_grad=args.clip_grad or None,
                  arrow={field: getattr(args, flag) for flag, field in ARROW_FLAGS.items()})
    return TrainConfig(**values)


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    results = train(config_from_args(args))
    if not args.quiet:
        test = results.get("test")
        print(f"best val top-1 {results['best_val_top1']:.4f} (epoch {results['best_epoch'] + 1})"
              + (f", test top-1 {test['top1']:.4f}" if test else "") + f"; outputs in {results['output_dir']}")
    return 0
