"""Training recipes (``--recipe``): each builds exactly the init, optimizer groups, schedule and augmentation it
states, fills only the settings left unset, and is recorded in the checkpoint and the card."""

from __future__ import annotations

import json
import math

import pytest
import timm
import torch
from test_training import arrow_config
from torch import nn
from torchvision import transforms

from pape_hub.card import render_model_card
from pape_hub.recipes import RECIPES, build_optimizer, get_recipe, init_linear_layers, lr_schedule
from pape_hub.training import TrainConfig, build_model, train
from pape_hub.training.data import data_transforms

MODEL = dict(embed_dim=32, depth=2, num_heads=2, num_classes=7)


def tiny(recipe: str, seed: int = 0, encoding: str = "pape") -> nn.Module:
    cfg = TrainConfig(model=f"vit_t4_{encoding}", model_kwargs=MODEL, recipe=recipe, drop_path=0.0)
    torch.manual_seed(seed)
    return build_model(cfg, num_classes=7, img_size=32)


def decayed_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[set[str], set[str]]:
    """(names with weight decay > 0, names without) of ``model``'s parameters in ``optimizer``."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    decayed, plain = set(), set()
    for group in optimizer.param_groups:
        (decayed if group["weight_decay"] > 0 else plain).update(name_of[id(p)] for p in group["params"])
    return decayed, plain


@pytest.mark.parametrize("name", list(RECIPES))
def test_optimizer_groups_are_the_stated_ones(name):
    recipe, model = get_recipe(name), tiny(name)
    cfg = TrainConfig(recipe=name)
    optimizer = build_optimizer(model, recipe, lr=1e-3, weight_decay=cfg.weight_decay)
    decayed, plain = decayed_names(model, optimizer)
    everything = {n for n, _ in model.named_parameters()}
    assert decayed | plain == everything and not decayed & plain
    expected_type = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[recipe.optimizer]
    assert type(optimizer) is expected_type
    assert all(g["betas"] == (0.9, 0.999) and g["eps"] == 1e-8 for g in optimizer.param_groups)
    if cfg.weight_decay == 0:  # LieRE: Adam, no weight decay at all
        assert decayed == set()
    elif recipe.decay_all:  # PaPE: AdamW decays every parameter, position parameters and norms included
        assert decayed == everything
        assert {g["weight_decay"] for g in optimizer.param_groups} == {cfg.weight_decay}
    else:  # biases, norms (1-D), position parameters and CLS are exempt
        exempt = {n for n, p in model.named_parameters() if p.ndim <= 1} | model.no_weight_decay()
        assert plain == exempt & everything
        assert any(n.startswith("pos_encoding.") for n in plain)


def test_paper_pape_init_is_pytorch_default_with_a_uniform_head():
    model = tiny("paper-pape")
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "head"]
    assert linears
    for name, linear in linears:  # nn.Linear's default: U(+-1/sqrt(fan_in)) for weights and biases
        bound = 1 / math.sqrt(linear.in_features)
        assert linear.weight.abs().max() <= bound, name
        assert linear.weight.abs().max() > 0.9 * bound, name  # spread over the whole interval, not std 0.02
        if linear.bias is not None:
            assert linear.bias.abs().max() <= bound and linear.bias.abs().max() > 0, name
    assert torch.equal(model.head.weight, torch.zeros_like(model.head.weight))
    assert torch.allclose(model.head.bias, torch.full((7,), -math.log(7)))
    logits = model(torch.randn(2, 3, 32, 32))
    assert torch.allclose(logits.softmax(-1), torch.full((2, 7), 1 / 7))  # every class equally likely at the start


def test_default_init_is_timm_and_encodings_keep_their_own():
    default, paper = tiny("default"), tiny("paper-pape")
    for name, linear in default.named_modules():
        if isinstance(linear, nn.Linear):
            assert linear.weight.std() < 0.03 and torch.all(linear.bias == 0), name  # truncated normal(0.02)
    # the position parameters are drawn before the linears are reset, so the same seed gives the same ones
    for (name, a), (_, b) in zip(default.pos_encoding.state_dict().items(), paper.pos_encoding.state_dict().items()):
        assert torch.equal(a, b), name
    bound = 1 / math.sqrt(default.pos_encoding.position_proj.shape[-1])
    assert paper.pos_encoding.position_proj.abs().max() <= bound


def test_init_only_changes_linears():
    model = timm.create_model("vit_t4_alibi", **MODEL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    init_linear_layers(model, get_recipe("paper-pape"))
    linear_keys = {f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, nn.Linear) for p in ("weight", "bias")}
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]) == (key not in linear_keys), key
    after = {k: v.clone() for k, v in model.state_dict().items()}
    init_linear_layers(model, get_recipe("default"))  # timm's init is the constructor's: nothing is redrawn
    assert all(torch.equal(v, after[k]) for k, v in model.state_dict().items())


def lrs_of(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int, per: int = 1) -> list[float]:
    values = []
    for step in range(steps):
        values.append(scheduler.get_last_lr()[0])
        if (step + 1) % per == 0:
            scheduler.optimizer.step()  # no gradients: nothing moves, but the order is PyTorch's
            scheduler.step()
    return values


def test_onecycle_is_pytorchs_onecyclelr():
    total, warmup, lr = 50, 7, 3e-3
    param = nn.Parameter(torch.zeros(1))
    torch_lrs = lrs_of(torch.optim.lr_scheduler.OneCycleLR(
        torch.optim.AdamW([param], lr=lr), max_lr=lr, total_steps=total, pct_start=warmup / total,
        anneal_strategy="cos", cycle_momentum=False, div_factor=25, final_div_factor=1e4), total)
    floor = TrainConfig(recipe="paper-pape", lr=lr).min_lr / lr
    factor = lr_schedule(get_recipe("paper-pape"), warmup, total, floor, steps_per_epoch=10)
    assert [lr * factor(s) for s in range(total)] == pytest.approx(torch_lrs, rel=1e-12, abs=1e-15)
    assert torch_lrs[0] == pytest.approx(lr / 25) and torch_lrs[warmup - 1] == pytest.approx(lr)


def test_cosine_epochs_is_cosineannealinglr_stepped_per_epoch():
    epochs, per_epoch, lr = 6, 4, 1e-3
    param = nn.Parameter(torch.zeros(1))
    torch_lrs = lrs_of(torch.optim.lr_scheduler.CosineAnnealingLR(torch.optim.AdamW([param], lr=lr), T_max=epochs),
                       epochs * per_epoch, per=per_epoch)
    factor = lr_schedule(get_recipe("paper-polar-rope"), 0, epochs * per_epoch, 0.0, per_epoch)
    assert [lr * factor(s) for s in range(epochs * per_epoch)] == pytest.approx(torch_lrs, rel=1e-12, abs=1e-15)


def test_default_schedule_is_unchanged():
    factor = lr_schedule(get_recipe("default"), 4, 20, 0.01, steps_per_epoch=4)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0 and factor(19) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 15 / 16)))


def test_recipe_fills_only_unset_settings_and_unknown_is_named():
    pape = TrainConfig(recipe="paper-pape", lr=6e-4, epochs=300)
    assert (pape.weight_decay, pape.warmup_epochs, pape.min_lr, pape.clip_grad, pape.aug) == \
        (0.05, 15.0, 6e-4 / 2.5e5, 0.0, "pape")
    assert TrainConfig(recipe="paper-pape", weight_decay=0.1, aug="none").weight_decay == 0.1
    liere = TrainConfig(recipe="paper-liere")
    assert (liere.weight_decay, liere.warmup_epochs, liere.label_smoothing, liere.aug) == (0.0, 0.0, 0.0,
                                                                                             "randaugment")
    default = TrainConfig()
    assert (default.weight_decay, default.warmup_epochs, default.min_lr, default.clip_grad, default.aug,
            default.label_smoothing, default.drop_path) == (0.05, 1.0, 1e-6, 1.0, "default", 0.1, 0.1)
    with pytest.raises(ValueError, match=r"recipe \(--recipe\) must be one of"):
        TrainConfig(recipe="paper-vit")
    with pytest.raises(ValueError, match=r"clip_grad \(--clip-grad\)"):
        TrainConfig(clip_grad=-1.0)


def test_cifar_preset_pads_then_crops():
    cfg = TrainConfig(recipe="paper-polar-rope", dataset="digits")
    train_tf, _ = data_transforms(cfg, 32, 3, [0.5] * 3, [0.5] * 3, crop_pct=1.0)
    crops = [t for t in train_tf.transforms[0].transforms if isinstance(t, transforms.RandomCrop)]
    assert len(crops) == 1 and crops[0].padding == 4 and crops[0].size == (32, 32)
    from PIL import Image

    out = train_tf(Image.new("RGB", (32, 32), (255, 255, 255)))
    assert out.shape == (3, 32, 32) and out.min() < out.max()  # some padding came into view somewhere
    with pytest.raises(ValueError, match="crop_padding"):
        data_transforms(cfg, 32, 3, [0.5] * 3, [0.5] * 3, crop_pct=1.0, video=True)


def test_paper_pape_run_is_recorded_in_checkpoint_and_card(tmp_path):
    cfg = arrow_config(tmp_path, recipe="paper-pape", epochs=1)
    results = train(cfg)
    assert math.isfinite(results["history"][0]["train_loss"])
    config = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    recipe = config["pape_hub"]["recipe"]
    assert recipe["name"] == "paper-pape" and recipe["weight_decay_on"] == "every parameter"
    card = str(render_model_card(config))
    assert "**`paper-pape`** (PaPE" in card and "uniform Kaiming" in card and "not stated by the source" in card
    with pytest.raises(ValueError, match="recipe: saved 'paper-pape', now 'default'"):
        train(arrow_config(tmp_path, recipe="default", epochs=1, resume=str(tmp_path / "run")))


def test_a_card_of_a_checkpoint_from_before_recipes_names_the_default():
    from pape_hub.card import _recipe_line

    line = _recipe_line({"lr": 0.002, "optimizer": "AdamW"})
    assert line.startswith("- recipe: **`default`** (pape_hub; recorded before recipes were named)")
    assert '"lr": 0.002' in line and _recipe_line({}) == "- recipe: not recorded"
