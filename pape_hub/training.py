"""One training loop on accelerate for every model and dataset (``pape-hub train`` / ``scripts/train.py``).

Recipe defaults follow PaPE table 8 / appendix E (AdamW, warm-up then cosine one-cycle schedule, no weight decay
on norms, biases and position parameters, label smoothing, drop path, RandAugment / Mixup / CutMix from
``timm.data`` for natural images); every value is a flag. Runs as ``python``, ``pape-hub`` or
``accelerate launch`` (CPU, one GPU or many).

Output folder:
    best/, last/         model.safetensors + config.json (timm Hub layout), written atomically each epoch
    state/               accelerate ``save_state`` (model, optimizer, scheduler, RNG, sampler) + trainer_state.json
    metrics.jsonl        one JSON line per epoch
    results.json         final numbers (test split scored with the best-on-validation checkpoint)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from timm.data import Mixup, create_transform
from timm.loss import SoftTargetCrossEntropy
from timm.models import get_pretrained_cfg
from timm.optim import create_optimizer_v2
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .checkpoint import atomic_write, replace_dir, save_checkpoint
from .data import ArrowConfig, build_data
from .models import model_args_for

__all__ = ["TrainConfig", "evaluate_loader", "train"]


@dataclass
class TrainConfig:
    model: str = "vit_t4_rope_mixed"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    dataset: str = "arrows"
    output_dir: str = "outputs/run"
    epochs: int = 8
    batch_size: int = 128
    lr: float = 2e-3
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    drop_path: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    randaugment: str = "rand-m9-mstd0.5-inc1"
    grad_accum: int = 1
    clip_grad: float | None = 1.0
    seed: int = 0
    mixed_precision: str = "no"
    resume: str | None = None
    stop_after_epoch: int | None = None  # stop early (the schedule still spans `epochs`); resume later
    push_to_hub: str | None = None
    num_workers: int = 0
    img_size: int | None = None
    val_fraction: float = 0.1
    train_size: int = 16384  # arrow task: generated training samples per epoch
    eval_size: int = 2000  # arrow task: validation and test samples
    arrow: dict[str, int] = field(default_factory=dict)  # ArrowConfig fields
    log_with: str | None = None
    image_column: str = "image"
    label_column: str = "label"
    quiet: bool = False

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoint it resumes."""
        return dict(model=self.model, model_kwargs=self.model_kwargs, dataset=self.dataset, epochs=self.epochs)


def lr_lambda(step: int, warmup: int, total: int, floor: float) -> float:
    """Linear warm-up to 1, then cosine to ``floor`` (a fraction of the peak)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate_loader(model: torch.nn.Module, loader: DataLoader, accelerator: Accelerator | None = None
                    ) -> dict[str, float]:
    """Top-1, top-5 and cross-entropy over a loader (gathered across processes)."""
    model.eval()
    correct1 = correct5 = loss_sum = count = 0.0
    for images, labels in loader:
        logits = model(images).float()
        if accelerator is not None:
            logits, labels = accelerator.gather_for_metrics((logits, labels))
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(-1).sum().item()
        count += labels.numel()
    return dict(top1=correct1 / max(count, 1), top5=correct5 / max(count, 1), loss=loss_sum / max(count, 1),
                count=int(count))


def build_model(cfg: TrainConfig, num_classes: int, img_size: int) -> torch.nn.Module:
    kwargs = dict(num_classes=num_classes, img_size=img_size, drop_path_rate=cfg.drop_path)
    kwargs.update(cfg.model_kwargs)
    return timm.create_model(cfg.model, **kwargs)


def check_resume(cfg: TrainConfig, state_dir: Path) -> dict[str, Any]:
    path = state_dir / "trainer_state.json"
    if not path.exists():
        raise FileNotFoundError(f"cannot resume: {path} does not exist (was the run saved at least one epoch?)")
    saved = json.loads(path.read_text())
    if saved["identity"] != cfg.identity():
        raise ValueError(f"cannot resume: {state_dir} is a checkpoint of {saved['identity']}, "
                         f"but this run is {cfg.identity()}")
    return saved


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train, validate every epoch, keep best/last, score the test split with the best; returns results."""
    out = Path(cfg.output_dir)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum,
        log_with=cfg.log_with, project_dir=str(out),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    set_seed(cfg.seed)
    main = accelerator.is_main_process

    # --- data ------------------------------------------------------------------------------------
    model_args_for(cfg.model)  # an unknown name fails here, before any data work
    arrow_cfg = ArrowConfig(**cfg.arrow)
    is_arrows = cfg.dataset == "arrows"
    img_size = arrow_cfg.image_size if is_arrows else (cfg.img_size or model_args_for(cfg.model)["img_size"])
    if is_arrows and cfg.img_size not in (None, img_size):
        raise ValueError(f"--img-size {cfg.img_size} does not match the arrow images ({img_size}px)")
    pretrained_cfg = get_pretrained_cfg(cfg.model).to_dict()  # data transforms follow the model's recipe
    mean, std = pretrained_cfg["mean"], pretrained_cfg["std"]
    train_tf = create_transform(img_size, is_training=True, auto_augment=cfg.randaugment or None, mean=mean,
                                std=std, interpolation="bicubic")
    eval_tf = create_transform(img_size, is_training=False, mean=mean, std=std, interpolation="bicubic",
                               crop_pct=pretrained_cfg.get("crop_pct", 0.9))
    data = build_data(cfg.dataset, img_size=img_size, seed=cfg.seed, val_fraction=cfg.val_fraction,
                      train_size=cfg.train_size, eval_size=cfg.eval_size, arrow_config=arrow_cfg,
                      train_transform=train_tf, eval_transform=eval_tf, image_column=cfg.image_column,
                      label_column=cfg.label_column)
    num_classes = len(data.classes)
    generator = torch.Generator().manual_seed(cfg.seed)
    train_loader = DataLoader(data.train, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                              num_workers=cfg.num_workers, generator=generator)
    val_loader = DataLoader(data.val, batch_size=cfg.batch_size, num_workers=cfg.num_workers)
    test_loader = DataLoader(data.test, batch_size=cfg.batch_size, num_workers=cfg.num_workers) \
        if data.test is not None else None
    if len(train_loader) == 0:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one batch of {cfg.batch_size}")

    # --- model, optimizer, schedule, loss --------------------------------------------------------
    model = build_model(cfg, num_classes, img_size)
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    warmup = max(1, round(cfg.warmup_epochs * steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, warmup, total_steps, cfg.min_lr / cfg.lr))
    mixup = None
    if data.is_images and (cfg.mixup > 0 or cfg.cutmix > 0):
        mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                      num_classes=num_classes)
        criterion: torch.nn.Module = SoftTargetCrossEntropy()
    else:
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    model, optimizer, train_loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, scheduler)
    if test_loader is not None:
        test_loader = accelerator.prepare(test_loader)

    # --- resume ----------------------------------------------------------------------------------
    state_dir = out / "state"
    start_epoch, best, history = 0, dict(top1=-1.0, epoch=-1), []
    if cfg.resume:
        resume_dir = Path(cfg.resume)
        resume_dir = resume_dir / "state" if (resume_dir / "state").is_dir() else resume_dir
        saved = check_resume(cfg, resume_dir)
        accelerator.load_state(str(resume_dir))
        start_epoch, best, history = saved["epoch"] + 1, saved["best"], saved["history"]
        if main and not cfg.quiet:
            print(f"resumed from {resume_dir} after epoch {saved['epoch']} (step {saved['step']})")
    if cfg.log_with:
        accelerator.init_trackers(out.name, config={k: str(v) for k, v in asdict(cfg).items()})

    if is_arrows:  # ArrowDataset scales pixels to [-1, 1] itself
        mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    data_config = dict(input_size=(3, img_size, img_size), mean=mean, std=std)
    facts = dict(dataset=data.description, model=cfg.model, model_kwargs=cfg.model_kwargs, seed=cfg.seed)
    started = time.time()
    last_epoch = cfg.epochs if cfg.stop_after_epoch is None else min(cfg.epochs, cfg.stop_after_epoch)
    for epoch in range(start_epoch, last_epoch):
        model.train()
        train_loader.set_epoch(epoch)
        loss_sum, seen = 0.0, 0
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not main or cfg.quiet,
                   leave=False)
        for images, labels in bar:
            with accelerator.accumulate(model):
                targets = labels
                if mixup is not None:
                    images, targets = mixup(images, labels)
                loss = criterion(model(images), targets)
                accelerator.backward(loss)
                if accelerator.sync_gradients and cfg.clip_grad:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.clip_grad)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.item() * labels.shape[0]
            seen += labels.shape[0]
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        val = evaluate_loader(model, val_loader, accelerator)
        record = dict(epoch=epoch, train_loss=loss_sum / max(seen, 1), val_top1=val["top1"], val_top5=val["top5"],
                      val_loss=val["loss"], lr=scheduler.get_last_lr()[0], images_seen=(epoch + 1) * len(data.train),
                      elapsed_s=round(time.time() - started, 1))
        history.append(record)
        accelerator.log(record, step=epoch)
        accelerator.wait_for_everyone()
        unwrapped = accelerator.unwrap_model(model)
        if main:
            if val["top1"] > best["top1"]:
                best = dict(top1=val["top1"], epoch=epoch)
                save_checkpoint(unwrapped, out / "best", data.classes, data_config, {**facts, "epoch": epoch,
                                                                                     "val_top1": val["top1"]})
            save_checkpoint(unwrapped, out / "last", data.classes, data_config, {**facts, "epoch": epoch})
            with open(out / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
            if not cfg.quiet:
                print(f"epoch {epoch + 1}/{cfg.epochs}: train loss {record['train_loss']:.4f}, "
                      f"val top-1 {val['top1']:.4f}, {record['elapsed_s']}s", flush=True)
        # full training state: written to a temporary folder, then swapped in
        tmp_state = out / ".state.tmp"
        accelerator.save_state(str(tmp_state))
        if main:
            trainer_state = dict(epoch=epoch, step=(epoch + 1) * steps_per_epoch, best=best, history=history,
                                 identity=cfg.identity(), config=asdict(cfg))
            atomic_write(tmp_state / "trainer_state.json", lambda p, s=trainer_state: p.write_text(json.dumps(s)))
            replace_dir(tmp_state, state_dir)
        accelerator.wait_for_everyone()

    results: dict[str, Any] = dict(best_epoch=best["epoch"], best_val_top1=best["top1"], history=history,
                                   output_dir=str(out), wall_s=round(time.time() - started, 1))
    if test_loader is not None and (out / "best").exists():
        from .checkpoint import load_checkpoint

        best_model, _ = load_checkpoint(out / "best")
        results["test"] = evaluate_loader(accelerator.prepare(best_model), test_loader, accelerator)
    if main:
        atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(results, indent=2)))
        if cfg.push_to_hub:
            from .hub import push_checkpoint

            results["hub_url"] = push_checkpoint(out / "best", cfg.push_to_hub)
    accelerator.end_training()
    return results

