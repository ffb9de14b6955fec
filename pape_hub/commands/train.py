r"""Any registered model on the arrow task, the motion task, an image or video dataset, or point clouds and event
streams (``shapes3d``, ``modelnet:PATH``, ``movingdot``, ``eventfolder:PATH``), with accelerate (one
process, several GPUs or several machines: ``accelerate launch -m pape_hub_cli train ...``). By default the arrow
task's micro ViT with RoPE-Mixed, about a minute an epoch on a laptop CPU.

Examples:
    pape-hub train --model vit_t4_rope_mixed --model-kwargs '{"patch_size": 12, "embed_dim": 96, "depth": 4,
        "num_heads": 4, "global_pool": "avg", "class_token": false}' --dataset arrows --output-dir outputs/rm
    pape-hub train --model vit_t4_pape --dataset digits --img-size 16 --aug none \
        --model-kwargs '{"patch_size": 2, "in_chans": 1}' --output-dir outputs/digits_pape
    pape-hub train --model vivit_t16_rope --dataset motion --model-kwargs '{"tubelet_size": [2, 8, 8],
        "embed_dim": 96, "depth": 4, "num_heads": 4}' --train-size 4096 --output-dir outputs/motion_rope
    accelerate launch -m pape_hub_cli train --model vit_s16_pape --dataset imagefolder:/data/imagenet --epochs 300
    pape-hub train --model pointvit_m_pape_ri --dataset shapes3d --model-kwargs '{"rotation_invariant_groups": true}'
    pape-hub train --model eventvit_s_pape --dataset eventfolder:/data/dvs_gesture --batch-size 32
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..data import DIGITS_INPUT, ArrowConfig, EventConfig, MotionConfig, ShapeConfig
from ..training import TrainConfig, train
from . import add_config_arguments, config_values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every TrainConfig field (and the arrow and motion tasks' settings) as a flag, described where it is
    declared; then what only the command does."""
    add_config_arguments(parser, TrainConfig)
    add_config_arguments(parser, ArrowConfig, prefix="arrow")
    add_config_arguments(parser, MotionConfig, prefix="motion")
    add_config_arguments(parser, ShapeConfig, prefix="shapes")
    add_config_arguments(parser, EventConfig, prefix="events")
    parser.add_argument("--push-to-hub", default=None, metavar="ORG/NAME",
                        help="after training, evaluate the best checkpoint, write its model card and push it")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = config_values(args, TrainConfig)
    if args.dataset == "digits":  # what digits need to be learned at all, where not given
        values.update({k: v for k, v in DIGITS_INPUT.items() if k != "model_kwargs" and values.get(k) is None})
        values["model_kwargs"] = {**DIGITS_INPUT["model_kwargs"], **values.get("model_kwargs", {})}
    return TrainConfig(**values, arrow=config_values(args, ArrowConfig, "arrow"),
                       motion=config_values(args, MotionConfig, "motion"),
                       shapes=config_values(args, ShapeConfig, "shapes"),
                       events=config_values(args, EventConfig, "events"))


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    if args.dataset == "digits" and not args.quiet:
        print(f"digits: {cfg.img_size} px, aug {cfg.aug!r}, model arguments {cfg.model_kwargs} (what 8x8 digits need "
              "to be learned at all; --img-size, --aug and --model-kwargs change it), recipe "
              f"{cfg.recipe!r}: {cfg.epochs} epochs at batch {cfg.batch_size}, lr {cfg.lr}", flush=True)
    repo_id = None
    if args.push_to_hub:
        from ..hub import check_push_target

        repo_id = check_push_target(args.push_to_hub)  # repo id, token and endpoint before the first step
    results = train(cfg)
    if not results["is_main_process"]:  # under `accelerate launch`, the main process reports and publishes
        return 0
    if not args.quiet:
        test = results.get("test")
        print(f"best val top-1 {results['best_val_top1']:.4f} (epoch {results['best_epoch'] + 1})"
              + (f", test top-1 {test['top1']:.4f}" if test else "") + f"; outputs in {results['output_dir']}")
    if repo_id:
        url = publish(cfg, repo_id)
        if not args.quiet:
            print(f"pushed {cfg.output_dir}/best with its evaluation and model card to {url}")
    return 0


def publish(cfg: TrainConfig, repo_id: str) -> str:
    """Training ends at a checkpoint; publishing it is evaluate -> card -> push: the best checkpoint is scored on
    the dataset it was trained on (its test split, at its training size; written into the folder with the plot), so
    the model card pushed with it reports a measured accuracy."""
    from ..evaluation import evaluate_checkpoint, save_evaluation
    from ..hub import push_checkpoint

    best = Path(cfg.output_dir) / "best"
    evaluation = evaluate_checkpoint(best, cfg.dataset, eval_size=cfg.eval_size, progress=not cfg.quiet)
    save_evaluation(evaluation, best)
    return push_checkpoint(best, repo_id)
