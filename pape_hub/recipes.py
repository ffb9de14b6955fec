"""Training recipes: how a model is initialised, which parameters weight decay reaches, the shape of the
learning-rate schedule, and the values a recipe gives the settings it states (``pape-hub train --recipe NAME``).

``default`` is this package's own recipe. The ``paper-*`` recipes reproduce what each paper's text states, and
nothing else: where a paper is silent, the recipe keeps PyTorch's or timm's default and says so in ``unstated``
(recorded in every checkpoint and card it trains). Learning rate, batch size and epochs are per dataset in every
paper (e.g. PaPE table 8), so they stay the run's own settings; the papers' ImageNet values are in ``stated``.

- ``default``: timm's ViT init (linear weights truncated normal(0.02), zero biases); AdamW without weight decay on
  biases, norms, position parameters and CLS; linear warm-up then cosine; DeiT's augmentation.
- ``paper-pape``: PyTorch's init (uniform Kaiming), head weights 0 and biases -log C; AdamW decaying every
  parameter; OneCycle with cosine annealing; RandAugment, flip, Mixup, CutMix.
- ``paper-liere``: init not stated (timm's); Adam (betas 0.9/0.999, eps 1e-8), no weight decay; cosine without
  warm-up; RandAugment; dropout 0.1.
- ``paper-polar-rope``: init not stated (timm's); AdamW without weight decay on biases, norms, position parameters
  and CLS; ``CosineAnnealingLR`` per epoch; pad-4 random crop and flip.

Every init keeps each encoding's own (its paper's) init of the position parameters and the layers' own defaults
for convolutions and norms; the recipes differ only in the linear layers of the blocks and the head.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from torch import nn

__all__ = ["RECIPES", "Recipe", "build_optimizer", "get_recipe", "init_linear_layers", "lr_schedule"]

#: augmentation presets (``--aug``); any part given explicitly overrides its preset value. ``crop_scale=None``:
#: no random-resized crop; ``crop_padding``: a random crop of the image size from the image padded by that much.
AUGMENTATION_PRESETS: dict[str, dict[str, Any]] = {
    "none": dict(crop_scale=None, crop_padding=0, hflip=0.0, color_jitter=0.0, randaugment="", mixup=0.0,
                 cutmix=0.0),
    "light": dict(crop_scale=(0.6, 1.0), crop_padding=0, hflip=0.5, color_jitter=0.0, randaugment="", mixup=0.0,
                  cutmix=0.0),
    "default": dict(crop_scale=(0.08, 1.0), crop_padding=0, hflip=0.5, color_jitter=0.4,
                    randaugment="rand-m9-mstd0.5-inc1", mixup=0.8, cutmix=1.0),
    # PaPE appendix E (ImageNet): "RandAugment, HorizontalFlip, MixUp, and CutMix"; their strengths are not
    # stated, so DeiT's (the default preset's) are used
    "pape": dict(crop_scale=None, crop_padding=0, hflip=0.5, color_jitter=0.0, randaugment="rand-m9-mstd0.5-inc1",
                 mixup=0.8, cutmix=1.0),
    # LieRE appendix B.2: "All vision experiments used RandAugment" (CIFAR on the original 32 px image)
    "randaugment": dict(crop_scale=None, crop_padding=0, hflip=0.0, color_jitter=0.0,
                        randaugment="rand-m9-mstd0.5-inc1", mixup=0.0, cutmix=0.0),
    # Polar RoPE section 4: RandomCrop(32, padding=4) and RandomHorizontalFlip()
    "cifar": dict(crop_scale=None, crop_padding=4, hflip=0.5, color_jitter=0.0, randaugment="", mixup=0.0,
                  cutmix=0.0),
}

@dataclass(frozen=True)
class Computed:
    """A recipe's value computed from the run's other settings (e.g. from its ``lr``), with how help shows it."""

    text: str
    compute: Callable[[Any], Any]

    def __str__(self) -> str:
        return self.text


#: a recipe's value for a setting: a number or string, or :class:`Computed`
Value = Any


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str  # where the recipe is stated
    init: str  # "timm": truncated normal(0.02) linears, zero biases; "pytorch": nn.Linear.reset_parameters
    uniform_head: bool  # head weights 0 and biases -log(classes): every class starts equally likely
    optimizer: str  # a timm optimizer name: "adamw" or "adam"
    decay_all: bool  # weight decay on every parameter; else not on 1-D parameters, position parameters and CLS
    schedule: str  # a key of SCHEDULES
    settings: dict[str, Value]  # TrainConfig values this recipe states (a value given explicitly wins)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # model arguments it states (explicit ones win)
    stated: str = ""  # the paper's own per-dataset values, for a reader reproducing its tables
    unstated: str = ""  # what the paper leaves open, and what the recipe uses there

    def summary(self) -> dict[str, Any]:
        """What a checkpoint and its card record about the recipe (the run's values are recorded beside it)."""
        groups = "every parameter" if self.decay_all else "all but biases, norms, position parameters and CLS"
        init = INIT_TEXT[self.init] + ("; head weights 0, biases -log(classes)" if self.uniform_head else "")
        return dict(name=self.name, source=self.source, init=init, optimizer=self.optimizer,
                    weight_decay_on=groups, schedule=SCHEDULE_TEXT[self.schedule],
                    **({"unstated": self.unstated} if self.unstated else {}))


INIT_TEXT = {
    "timm": "timm's ViT init: linear weights truncated normal(std 0.02), zero biases",
    "pytorch": "PyTorch's default (uniform Kaiming, a=sqrt(5)) for every linear layer, biases U(+-1/sqrt(fan_in))",
}
SCHEDULE_TEXT = {
    "warmup_cosine": "linear warm-up to lr, then cosine to min_lr, per step",
    "onecycle": "OneCycle (PyTorch OneCycleLR, cosine both ways): lr/25 up to lr over the warm-up, then down to "
                "min_lr, per step; momentum not cycled",
    "cosine_epochs": "cosine annealing from lr to min_lr (PyTorch CosineAnnealingLR, T_max = epochs), per epoch",
}

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("default", "pape_hub", init="timm", uniform_head=False, optimizer="adamw", decay_all=False,
           schedule="warmup_cosine",
           settings=dict(weight_decay=0.05, warmup_epochs=1.0, min_lr=1e-6, label_smoothing=0.1, drop_path=0.1,
                         clip_grad=1.0, aug="default")),
    # ImageNet: "we initialize the weights [of the classifier head] to 0 and the bias to -log(1000)"
    Recipe("paper-pape", "PaPE (arXiv 2602.01418) section 4 and appendix E, table 8", init="pytorch",
           uniform_head=True, optimizer="adamw", decay_all=True, schedule="onecycle",
           # OneCycleLR's defaults end at lr / (div_factor 25 x final_div_factor 1e4); warm-up 15 of 300 epochs
           settings=dict(weight_decay=0.05, warmup_epochs=Computed("epochs/20", lambda cfg: 0.05 * cfg.epochs),
                         min_lr=Computed("lr/2.5e5", lambda cfg: cfg.lr / 2.5e5), label_smoothing=0.1,
                         drop_path=0.1, clip_grad=0.0, aug="pape"),
           stated="ImageNet-1K: batch 1024, lr 6e-4, weight decay 0.05, betas (0.9, 0.999), warm-up 15 of 300 "
                  "epochs, drop path 0.1, label smoothing 0.1, 16-bit mixed precision",
           unstated="RandAugment, Mixup and CutMix strengths (DeiT's); gradient clipping (none); the CLS token's "
                    "init (timm's); OneCycle's div factors (PyTorch's)"),
    Recipe("paper-liere", "LieRE (arXiv 2406.10322) appendix B", init="timm", uniform_head=False,
           optimizer="adam", decay_all=True,
           schedule="warmup_cosine",
           settings=dict(weight_decay=0.0, warmup_epochs=0.0, min_lr=0.0, label_smoothing=0.0, drop_path=0.0,
                         clip_grad=0.0, aug="randaugment"),
           model_kwargs=dict(proj_drop_rate=0.1),  # "We use a dropout of 0.1"
           stated="CIFAR-100: ViT-B, patch 4, effective batch 512, lr 1e-4, 200 epochs, CLS pooling",
           unstated="the init (timm's); where the dropout sits (after the attention projection and the MLP, as "
                    "the projection dropout); the RandAugment strength (DeiT's); no warm-up, clipping or label "
                    "smoothing is mentioned"),
    Recipe("paper-polar-rope", "Polar RoPE, experimental setup (CIFAR-10)", init="timm", uniform_head=False,
           optimizer="adamw",
           decay_all=False, schedule="cosine_epochs",
           settings=dict(weight_decay=1e-4, warmup_epochs=0.0, min_lr=0.0, label_smoothing=0.0, drop_path=0.0,
                         clip_grad=0.0, aug="cifar"),
           stated="CIFAR-10: ViT width 192, depth 9, 12 heads, patch 4, batch 128, lr 1e-3, 50 epochs",
           unstated="the init (timm's); drop path (none); warm-up and clipping are not mentioned"),
)}
RECIPE_SETTINGS = tuple(RECIPES["default"].settings)


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"recipe (--recipe) must be one of {list(RECIPES)}, got {name!r}")
    return RECIPES[name]


def resolve(value: Value, config: Any) -> Any:
    """A recipe's value for a run with ``config``'s settings."""
    return value.compute(config) if isinstance(value, Computed) else value


def setting_help(name: str) -> str:
    """What each recipe gives setting ``name``, for ``--help``."""
    return "default: the recipe's: " + ", ".join(f"{r.name} {r.settings[name]}" for r in RECIPES.values())


@torch.no_grad()
def init_linear_layers(model: nn.Module, recipe: Recipe) -> None:
    """Re-initialise the linear layers of the blocks and the head as ``recipe`` states (``timm``: as the model's
    constructor did, so nothing is drawn again). Position encodings hold no linear layers: they keep their own
    init."""
    if recipe.init == "pytorch":
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    if recipe.uniform_head and isinstance(head, nn.Linear):
        nn.init.zeros_(head.weight)
        nn.init.constant_(head.bias, -math.log(head.out_features))


def build_optimizer(model: nn.Module, recipe: Recipe, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """The recipe's optimizer: timm's, with weight decay on every parameter (``decay_all``), or on all but 1-D
    parameters and the model's ``no_weight_decay()`` names (position parameters, CLS)."""
    # timm exempts a module's no_weight_decay() names whatever filter_bias_and_bn says: hand it the bare parameters
    params = list(model.parameters()) if recipe.decay_all else model
    return create_optimizer_v2(params, recipe.optimizer, lr=lr, weight_decay=weight_decay)


def warmup_cosine(step: int, warmup: int, total: int, floor: float, steps_per_epoch: int) -> float:
    """Linear warm-up to 1, then cosine to ``floor`` (a fraction of the peak), per step."""
    if step < warmup:
        return (step + 1) / warmup
    return _cosine_between(1.0, floor, min(1.0, (step - warmup) / max(1, total - warmup)))


def _cosine_between(start: float, end: float, progress: float) -> float:
    """Cosine annealing from ``start`` (progress 0) to ``end`` (progress 1)."""
    return end + (start - end) / 2 * (math.cos(math.pi * progress) + 1)


def onecycle(step: int, warmup: int, total: int, floor: float, steps_per_epoch: int, div: float = 25.0) -> float:
    """PyTorch's ``OneCycleLR`` (``anneal_strategy='cos'``, ``pct_start = warmup / total``) as a factor of the
    peak: from 1/div up to 1 at step ``warmup - 1``, then down to ``floor`` at the last step."""
    peak_step, last_step = float(warmup) - 1, total - 1
    if step <= peak_step:
        return _cosine_between(1 / div, 1.0, step / peak_step) if peak_step > 0 else 1.0
    return _cosine_between(1.0, floor, min(1.0, (step - peak_step) / max(last_step - peak_step, 1)))


def cosine_epochs(step: int, warmup: int, total: int, floor: float, steps_per_epoch: int) -> float:
    """``CosineAnnealingLR(T_max=epochs, eta_min=floor x lr)`` stepped once per epoch (after a linear warm-up
    if one is asked for)."""
    if step < warmup:
        return (step + 1) / warmup
    epoch, epochs = step // steps_per_epoch, max(1, total // steps_per_epoch)
    return _cosine_between(1.0, floor, min(epoch, epochs) / epochs)


SCHEDULES: dict[str, Callable[..., float]] = dict(warmup_cosine=warmup_cosine, onecycle=onecycle,
                                                  cosine_epochs=cosine_epochs)


def lr_schedule(recipe: Recipe, warmup: int, total: int, floor: float, steps_per_epoch: int
                ) -> Callable[[int], float]:
    """The factor of the peak learning rate at each optimizer step (a ``LambdaLR`` function)."""
    schedule = SCHEDULES[recipe.schedule]
    return lambda step: schedule(step, warmup, total, floor, steps_per_epoch)
