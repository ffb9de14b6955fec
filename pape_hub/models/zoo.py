"""The model table: every (size x patch setting x encoding) is one timm model, ``vit_{size}{patch}_{encoding}``.

``vit_b16_pape`` = ViT-B, patch 16 at 224^2, PaPE. ``vit_t4_rope_mixed`` = ViT-Ti, patch 4 at 32^2 (the
CIFAR setting of the papers), RoPE-Mixed. Add a size or setting to the tables below; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from ..encodings import list_encodings
from .vit import VisionTransformer

__all__ = ["MODEL_SIZES", "PATCH_SETTINGS", "list_pape_models", "model_args_for"]

HUB_ORG = "pape-hub"  # where published weights live: hf-hub:pape-hub/{model name}
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

MODEL_SIZES: dict[str, dict[str, int]] = {
    "t": dict(embed_dim=192, depth=12, num_heads=3),  # ViT-Ti
    "s": dict(embed_dim=384, depth=12, num_heads=6),  # ViT-S
    "b": dict(embed_dim=768, depth=12, num_heads=12),  # ViT-B
    "l": dict(embed_dim=1024, depth=24, num_heads=16),  # ViT-L
}
PATCH_SETTINGS: dict[int, dict[str, Any]] = {
    16: dict(img_size=224, sizes="tsbl", num_classes=1000, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
    4: dict(img_size=32, sizes="ts", num_classes=10, mean=CIFAR_MEAN, std=CIFAR_STD),
}


def _names() -> dict[str, tuple[str, int, str]]:
    return {
        f"vit_{size}{patch}_{enc}": (size, patch, enc)
        for patch, setting in PATCH_SETTINGS.items()
        for size in setting["sizes"]
        for enc in list_encodings()
    }


_MODELS = _names()


def list_pape_models() -> list[str]:
    """Every model name this package registers in timm."""
    return list(_MODELS)


def model_args_for(name: str) -> dict[str, Any]:
    """Constructor arguments of a registered model name."""
    if name not in _MODELS:
        raise ValueError(f"unknown pape_hub model {name!r}; e.g. {', '.join(list(_MODELS)[:4])}, ...")
    size, patch, enc = _MODELS[name]
    setting = PATCH_SETTINGS[patch]
    return dict(
        img_size=setting["img_size"], patch_size=patch, num_classes=setting["num_classes"],
        position_encoding=enc, **MODEL_SIZES[size],
    )


def _cfg(name: str) -> dict[str, Any]:
    size, patch, enc = _MODELS[name]
    setting = PATCH_SETTINGS[patch]
    return dict(
        hf_hub_id=f"{HUB_ORG}/{name}", num_classes=setting["num_classes"],
        input_size=(3, setting["img_size"], setting["img_size"]), pool_size=None, crop_pct=1.0 if patch == 4 else 0.9,
        interpolation="bicubic", fixed_input_size=False, mean=setting["mean"], std=setting["std"],
        first_conv="patch_embed.proj", classifier="head", license="apache-2.0",
        notes=(f"ViT-{size.upper()}/{patch}, {enc} position encoding",),
    )


default_cfgs = generate_default_cfgs({name: _cfg(name) for name in _MODELS})


def checkpoint_filter_fn(state_dict: dict[str, Any], model: VisionTransformer) -> dict[str, Any]:
    """Accept both checkpoint layouts: timm's keys, and the transformers face's ``vit.``-prefixed ones."""
    return {k.removeprefix("vit."): v for k, v in state_dict.items()}


def _create(name: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        VisionTransformer, name, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **{**model_args_for(name), **kwargs},
    )


def _entrypoint(name: str) -> Callable[..., VisionTransformer]:
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
        return _create(name, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"{default_cfgs[name].default.notes[0]} (pape_hub)."
    return entrypoint


for _name in _MODELS:
    globals()[_name] = register_model(_entrypoint(_name))
