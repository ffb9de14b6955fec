"""The loop: the model, optimizer, schedule and loss prepared by accelerate, the epochs, and the checkpoints each
epoch leaves (:func:`train`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy

from ..checkpoint import atomic_write, replace_dir, save_checkpoint
from ..cpu import flush_denormals
from ..data import data_fingerprint
from ..evaluation import evaluate_loader, plot_training_curve
from ..models import model_args_for
from ..progress import Progress, duration
from ..recipes import build_optimizer, get_recipe, init_linear_layers, lr_schedule
from .data import prepare_data
from .run_folder import check_output_dir, check_resume, claim_output_dir, release_output_dir, resume_state_dir
from .settings import TrainConfig, recipe_summary

__all__ = ["Run", "build_model", "launched_processes", "seed_from", "train", "warn_if_launched_as_one"]

def train(cfg: TrainConfig, on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train, validate every epoch, keep best/last, score the test split with the best; returns results.
    ``on_epoch`` receives each finished epoch's record (main process; e.g. a parent's progress bar).

    Everything is checked (settings, model, output folder, data) before the output folder is touched. Training
    ends at the checkpoints; evaluating, carding and pushing them is the caller's (``pape-hub train
    --push-to-hub`` composes them)."""
    model_args_for(cfg.model)  # an unknown name fails here, before any work
    check_output_dir(cfg)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum,
        log_with=cfg.log_with, project_dir=str(cfg.output_dir),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    refuse_unjoined_processes(accelerator)
    set_seed(cfg.seed)
    warn_if_launched_as_one(accelerator)
    talk = accelerator.is_main_process and not cfg.quiet
    if talk:  # at once: the data and the model take a while to prepare
        print(f"training {cfg.model} on {cfg.dataset} for {cfg.epochs} epochs into {cfg.output_dir} "
              f"({accelerator.device}, {torch.get_num_threads()} threads x {accelerator.num_processes} process(es)); "
              "preparing the data and the model", flush=True)
    run = build_run(cfg, accelerator)
    if talk:
        sizes = " / ".join(f"{len(split):,} {name}" for name, split in (("training", run.data.train),
                                                                        ("validation", run.data.val),
                                                                        ("test", run.data.test)) if split is not None)
        parameters = sum(p.numel() for p in accelerator.unwrap_model(run.model).parameters())
        if "input_size" not in run.data_config:  # point clouds and event streams: no pixels
            size = "of any length (padded per batch)"
        elif cfg.native_resolution:
            size = "at native resolution"
        else:
            _, height, width = run.data_config["input_size"]
            size = f"at {height}x{width} px{'' if cfg.img_size else ' (the model input size; --img-size changes it)'}"
        print(f"  {parameters / 1e6:.2f}M parameters; {sizes} samples {size}; {run.steps_per_epoch} steps of "
              f"{cfg.batch_size * cfg.grad_accum} per epoch", flush=True)
        if note := schedule_note(cfg, len(run.data.train), run.steps_per_epoch):
            print(note, flush=True)
    lock = claim_output_dir(cfg, accelerator.is_main_process)
    try:
        with flush_denormals(cfg.flush_denormals and accelerator.device.type == "cpu"):
            return fit(cfg, accelerator, run, on_epoch)
    finally:
        release_output_dir(lock, cfg)


#: fewer optimizer steps than this in a whole run rarely learn anything from scratch: the run says so at the start
MIN_STEPS = 100


def schedule_note(cfg: TrainConfig, train_samples: int, steps_per_epoch: int) -> str | None:
    """A note where the whole run takes fewer than :data:`MIN_STEPS` optimizer steps (a small folder at the default
    batch of 128), naming the batch size that would give that many; None otherwise."""
    total = cfg.epochs * steps_per_epoch
    if total >= MIN_STEPS:
        return None
    batch = cfg.batch_size
    while batch > 8 and cfg.epochs * math.ceil(train_samples / (batch * cfg.grad_accum)) < MIN_STEPS:
        batch //= 2
    steps = cfg.epochs * math.ceil(train_samples / (batch * cfg.grad_accum))
    fix = f"--batch-size {batch} gives {steps}" if batch < cfg.batch_size else "smaller batches cannot give more"
    return (f"note: {train_samples:,} training samples at batch {cfg.batch_size * cfg.grad_accum} make {total} "
            f"optimizer step(s) in {cfg.epochs} epochs, too few to learn from scratch (aim for {MIN_STEPS} or more): "
            f"{fix}; more --epochs add the rest (docs/training.md, \"A small folder of your own\")")


@dataclass
class Run:
    """Everything a training run is made of once the settings, data and model are checked."""

    data: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    criterion: torch.nn.Module
    mixup: Mixup | None
    train_loader: Any
    val_loader: Any
    test_loader: Any
    steps_per_epoch: int
    data_config: dict[str, Any]
    facts: dict[str, Any]


def build_run(cfg: TrainConfig, accelerator: Accelerator) -> Run:
    """Data, model, optimizer, schedule and loss, prepared by accelerate."""
    prepared = prepare_data(cfg, (accelerator.device, accelerator.process_index, accelerator.num_processes))
    data, num_classes = prepared.data, len(prepared.data.classes)
    model = build_model(cfg, num_classes, prepared.img_size, prepared.num_frames)
    if cfg.init_from:
        seeded = seed_from(cfg.init_from, model)
        if accelerator.is_main_process and not cfg.quiet:
            print(seeded)
    recipe = get_recipe(cfg.recipe)
    optimizer = build_optimizer(model, recipe, cfg.lr, cfg.weight_decay)
    if cfg.native_resolution:  # timm's NaFlex batches: already this process's share, on its device
        model, optimizer = accelerator.prepare(model, optimizer)
        train_loader, val_loader = prepared.train_loader, prepared.val_loader
    else:
        model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, prepared.train_loader,
                                                                         prepared.val_loader)
    # the schedule counts optimizer steps of one process (its shard of the data); accelerate steps a prepared
    # scheduler once per process at each optimizer step, hence the division: N processes at batch B follow the
    # schedule of one process at batch N x B
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    warmup = max(1, round(cfg.warmup_epochs * steps_per_epoch))
    processes = accelerator.num_processes
    factor = lr_schedule(recipe, warmup, total_steps, cfg.min_lr / cfg.lr, steps_per_epoch)
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: factor(s // processes)))
    aug = cfg.augmentation()
    mixup = None
    if data.natural_images and (aug["mixup"] > 0 or aug["cutmix"] > 0):
        if not cfg.native_resolution:  # at native resolution timm's loader mixes (training.native.mixup_for)
            mixup = Mixup(mixup_alpha=aug["mixup"], cutmix_alpha=aug["cutmix"], label_smoothing=cfg.label_smoothing,
                          num_classes=num_classes)
        criterion: torch.nn.Module = SoftTargetCrossEntropy()
    else:
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    test_loader = prepared.test_loader
    if test_loader is not None and not cfg.native_resolution:
        test_loader = accelerator.prepare(test_loader)
    facts = dict(dataset=data.description, model=cfg.model, model_kwargs=cfg.model_kwargs, seed=cfg.seed,
                 recipe=recipe_summary(cfg))
    if cfg.init_from:  # where the weights started: a public checkpoint's Hub id is the card's base_model
        facts["seeded_from"] = seed_hub_id(cfg.init_from)
    return Run(data, model, optimizer, scheduler, criterion, mixup, train_loader, val_loader, test_loader,
               steps_per_epoch, prepared.data_config, facts)


def build_model(cfg: TrainConfig, num_classes: int, img_size: int | None, num_frames: int | None = None
                ) -> torch.nn.Module:
    """The model, initialised as the recipe states (its model arguments, e.g. dropout, unless given explicitly);
    ``img_size`` None for point and event models."""
    recipe = get_recipe(cfg.recipe)
    kwargs = dict(num_classes=num_classes, drop_path_rate=cfg.drop_path, **recipe.model_kwargs)
    if img_size is not None:
        kwargs["img_size"] = img_size
    if num_frames is not None:
        kwargs["num_frames"] = num_frames
    kwargs.update(cfg.model_kwargs)
    model = timm.create_model(cfg.model, **kwargs)
    init_linear_layers(model, recipe)
    return model


def seed_from(source: str, model: torch.nn.Module) -> str:
    """Transplant (:func:`pape_hub.transplant`) a checkpoint folder's or a converted entry's (``NAME.TAG``) weights
    into ``model``: the backbone always, position weights where the encoding is the same, the head where the
    classes agree; the model's own init for the rest. Says what was copied and what is new."""
    from ..checkpoint import load_checkpoint
    from ..models.pretrained import SOURCES, transplant

    if source in SOURCES:
        weights = timm.create_model(source, pretrained=True)
    elif Path(source).is_dir():
        weights, _ = load_checkpoint(source)
    else:
        raise ValueError(f"init_from (--init-from) {source!r} is neither a checkpoint folder nor a converted entry "
                         "(pape_hub.list_pretrained())")
    return f"seeded from {source}: {transplant(weights, model).summary()}"


def seed_hub_id(source: str) -> str | None:
    """The Hub repo a seed's weights come from (a converted entry's source), None for a local folder."""
    from ..models.pretrained import SOURCES, source_cfg

    return source_cfg(source).get("hf_hub_id") if source in SOURCES else None


def launched_processes() -> int | None:
    """How many processes ``accelerate launch`` was asked for when it started this one with its simple launcher (it
    sets MASTER_ADDR for several but starts one, and no WORLD_SIZE): the launcher's own ``--num_processes``, read
    from its command line (2 or more where that cannot be read); None when not launched that way."""
    if not os.environ.get("ACCELERATE_USE_CPU") or not os.environ.get("MASTER_ADDR") or os.environ.get("WORLD_SIZE"):
        return None
    try:
        words = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return 2
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag in ("--num_processes", "--num-processes"):
            value = value or (words[i + 1] if i + 1 < len(words) else "")
            return int(value) if value.isdigit() else 2
    return 2


def refuse_unjoined_processes(accelerator: Accelerator) -> None:
    """Refuse, in every process, a launch that started several processes (``WORLD_SIZE``) which did not join one run:
    ``accelerate launch --multi_gpu`` on a machine without GPUs starts N processes that each train alone, into one
    output folder (before the output folder is touched, so that no process writes anything)."""
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1 and accelerator.num_processes == 1:
        raise ValueError(f"the launcher started {world} processes but they did not join one run (each is process 1 of "
                         "1: --multi_gpu on a machine without GPUs); set ACCELERATE_USE_CPU=true to train as "
                         f"{world} CPU processes (ACCELERATE_USE_CPU=true accelerate launch --multi_gpu "
                         f"--num_processes {world} ...), or launch one process")


def warn_if_launched_as_one(accelerator: Accelerator) -> None:
    """Say so when ``accelerate launch --num_processes N`` started one process: on a machine without GPUs accelerate
    starts N only with ``--multi_gpu`` (and ``--cpu``); the run goes on as one process."""
    asked = launched_processes()
    if asked and asked > 1 and accelerator.num_processes == 1:
        print(f"warning: accelerate launch was asked for {asked} processes but started one (this is process 1 of 1):"
              f" on a machine without GPUs, add --multi_gpu to the launch command for {asked} CPU processes "
              f"(ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes {asked} ...); training "
              "continues as one process", file=sys.stderr, flush=True)


def fit(cfg: TrainConfig, accelerator: Accelerator, run: Run,
        on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The epochs (from a resumed state if asked), then the test score of the best checkpoint."""
    out, main = Path(cfg.output_dir), accelerator.is_main_process
    start_epoch, best, history = 0, dict(top1=-1.0, epoch=-1), []
    if cfg.resume:
        state_dir = resume_state_dir(cfg.resume)
        saved = check_resume(cfg, state_dir, data_fingerprint(run.data))
        accelerator.load_state(str(state_dir))
        start_epoch, best, history = saved["epoch"] + 1, saved["best"], saved["history"]
        if main and not cfg.quiet:
            print(f"resumed from {state_dir} after epoch {saved['epoch'] + 1} (step {saved['step']})")
    if cfg.log_with:
        accelerator.init_trackers(out.name, config={k: str(v) for k, v in asdict(cfg).items()})
    started = time.time()
    last_epoch = cfg.epochs if cfg.stop_after_epoch is None else min(cfg.epochs, cfg.stop_after_epoch)
    for epoch in range(start_epoch, last_epoch):
        epoch_started = time.time()
        train_loss = train_one_epoch(cfg, accelerator, run, epoch)
        val = evaluate_loader(run.model, run.val_loader, accelerator)
        record = dict(epoch=epoch, train_loss=train_loss, val_top1=val["top1"], val_top5=val["top5"],
                      val_loss=val["loss"], lr=run.scheduler.get_last_lr()[0],
                      images_seen=(epoch + 1) * len(run.data.train), epoch_s=round(time.time() - epoch_started, 1),
                      elapsed_s=round(time.time() - started, 1))
        history.append(record)
        accelerator.log(record, step=epoch)
        if val["top1"] > best["top1"]:
            best = dict(top1=val["top1"], epoch=epoch)
        save_epoch(cfg, accelerator, run, record, best, history)
        if main and not cfg.quiet:
            left = (time.time() - started) / (epoch + 1 - start_epoch) * (last_epoch - epoch - 1)
            print(f"epoch {epoch + 1}/{cfg.epochs}: train loss {train_loss:.4f}, val top-1 {val['top1']:.4f}, "
                  f"{duration(record['epoch_s'])} this epoch, {duration(record['elapsed_s'])} elapsed"
                  + (f", {duration(left)} left" if left else ""), flush=True)
        if on_epoch is not None and main:
            on_epoch(record)
    return finish(cfg, accelerator, run, best, history, started)


def train_one_epoch(cfg: TrainConfig, accelerator: Accelerator, run: Run, epoch: int) -> float:
    """One pass over the training split; returns the mean loss. A non-finite loss stops the run before the
    optimizer step, so the weights and the checkpoints of the last finished epoch stay as they were."""
    run.model.train()
    run.train_loader.set_epoch(epoch)
    loss_sum, seen = 0.0, 0
    # a bar on a terminal; in a log, a plain line every 30 s (and the per-epoch line save_epoch prints)
    bar = Progress(run.train_loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
                   enabled=accelerator.is_main_process and not cfg.quiet)
    for step, (images, labels) in enumerate(bar):
        with accelerator.accumulate(run.model):
            targets = labels
            if run.mixup is not None:
                images, targets = run.mixup(images, labels)
            loss = run.criterion(run.model(images), targets)
            value = loss.item()  # one host sync per step, shared by the finiteness check and the running mean
            check_finite_loss(value, accelerator, epoch, step, Path(cfg.output_dir))
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.clip_grad:
                accelerator.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
        loss_sum += value * labels.shape[0]
        seen += labels.shape[0]
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", lr=f"{run.scheduler.get_last_lr()[0]:.2e}")
    return loss_sum / max(seen, 1)


def check_finite_loss(loss: float, accelerator: Accelerator, epoch: int, step: int, out: Path) -> None:
    """Raise on a NaN or infinite loss in any process (every process stops together)."""
    finite = math.isfinite(loss)
    if accelerator.num_processes > 1:
        flag = torch.tensor([float(finite)], device=accelerator.device)
        finite = accelerator.reduce(flag, reduction="sum").item() == accelerator.num_processes
    if not finite:
        kept = out / "last" if (out / "last").exists() else None
        raise FloatingPointError(
            f"the training loss is {loss} at epoch {epoch + 1}, step {step + 1}: stopping "
            f"({'the last good checkpoint is ' + str(kept) if kept else 'no epoch finished, so nothing was saved'}); "
            "lower --lr or check the data")


def save_epoch(cfg: TrainConfig, accelerator: Accelerator, run: Run, record: dict[str, Any], best: dict[str, Any],
               history: list[dict[str, Any]]) -> None:
    """best/ (when the validation score improved), last/, metrics.jsonl and the full training state."""
    out, main, epoch = Path(cfg.output_dir), accelerator.is_main_process, record["epoch"]
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(run.model)
    if main:
        kwargs = dict(label_names=run.data.classes, data_config=run.data_config)
        if best["epoch"] == epoch:
            save_checkpoint(unwrapped, out / "best", **kwargs,
                            extra={**run.facts, "epoch": epoch, "val_top1": record["val_top1"]})
        save_checkpoint(unwrapped, out / "last", **kwargs, extra={**run.facts, "epoch": epoch})
        # the whole file from the history the state holds: a run resumed after a kill or a failed save never repeats
        # an epoch's line
        atomic_write(out / "metrics.jsonl", lambda p: p.write_text("".join(json.dumps(h) + "\n" for h in history)))
        atomic_write(out / "training_curve.png", lambda p: plot_training_curve(history, p, f"{cfg.model} on "
                                                                               f"{cfg.dataset}, seed {cfg.seed}"))
        shutil.rmtree(out / ".state.tmp", ignore_errors=True)  # what a killed save left: never complete
        (out / ".state.tmp").mkdir()  # before any process writes its share of the state into it
    accelerator.wait_for_everyone()
    # full training state: written to a temporary folder, then swapped in once every process has written its part
    # (each writes its own random-number state; the swap must not move the folder from under a slower one)
    tmp_state = out / ".state.tmp"
    try:
        accelerator.save_state(str(tmp_state))
    except (OSError, RuntimeError) as err:  # a full disk, a quota (torch's writer raises RuntimeError): the
        if isinstance(err, RuntimeError) and "write" not in str(err).lower():  # previous state/ was not touched
            raise
        raise OSError(f"could not write the training state of epoch {epoch + 1} to {tmp_state} ({err}); the state "
                      f"of the previous epoch in {out / 'state'} is intact: free space, then --resume {out}") from err
    accelerator.wait_for_everyone()
    if main:
        trainer_state = dict(epoch=epoch, step=(epoch + 1) * run.steps_per_epoch, best=best, history=history,
                             identity=cfg.identity(), config=asdict(cfg), data=data_fingerprint(run.data))
        atomic_write(tmp_state / "trainer_state.json", lambda p, s=trainer_state: p.write_text(json.dumps(s)))
        replace_dir(tmp_state, out / "state")
    accelerator.wait_for_everyone()


def finish(cfg: TrainConfig, accelerator: Accelerator, run: Run, best: dict[str, Any],
           history: list[dict[str, Any]], started: float) -> dict[str, Any]:
    out, main = Path(cfg.output_dir), accelerator.is_main_process
    results: dict[str, Any] = dict(best_epoch=best["epoch"], best_val_top1=best["top1"], history=history,
                                   output_dir=str(out), wall_s=round(time.time() - started, 1))
    if run.test_loader is not None and (out / "best").exists():
        from ..checkpoint import load_checkpoint

        best_model, _ = load_checkpoint(out / "best")
        results["test"] = evaluate_loader(accelerator.prepare(best_model), run.test_loader, accelerator)
    if main:
        atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(results, indent=2)))
    accelerator.end_training()
    return dict(results, is_main_process=main)  # under `accelerate launch`, only the main process reports
