"""The model table: every (family x size x patch setting x encoding) is one timm model,
``{family}_{size}{patch}_{encoding}``.

``vit_b16_pape`` = ViT-B, patch 16 at 224^2, PaPE. ``vit_t4_rope_mixed`` = ViT-Ti, patch 4 at 32^2 (the
CIFAR setting of the papers), RoPE-Mixed. ``vit_m12_pape`` = the arrow task's model: a micro ViT (width 96, depth 4,
4 heads), patch 12 at 48^2 (a 4 x 4 grid of 12-px cells), average pooling without CLS, 4 classes - what ``pape-hub
arrows`` trains and ``pape-hub train`` trains by default, a minute an epoch on a laptop CPU. ``vivit_b16_pape`` =
ViViT-B, 16 frames of 224^2 in 2 x 16 x 16 tubelets (Kinetics-400 classes), PaPE; video models exist for the
encodings defined in 3-D. Add a size or setting to the tables below; nothing else changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model, resolve_pretrained_cfg

from ..encodings import encoding_class, list_encodings
from ..encodings.registry import free_coordinates_problem
from .eventvit import EventVisionTransformer
from .pointvit import PointVisionTransformer
from .pretrained import SOURCES, checkpoint_filter_fn, source_cfg
from .vit import VisionTransformer
from .vivit import VideoVisionTransformer

__all__ = [
    "EVENT_SETTINGS", "FREE_TOKEN_FAMILIES", "MODEL_SIZES", "PATCH_SETTINGS", "POINT_SETTINGS", "PUBLISHED_WEIGHTS",
    "SOURCE_CONFIG_CHECKS", "VIDEO_SETTINGS", "free_token_architecture", "list_pape_models", "list_pretrained",
    "model_args_for", "register_published_weights",
]

#: Weights of this package's own training published on the Hugging Face Hub: model name -> repo id (none yet). Public
#: checkpoints of other ViTs are tagged entries (``vit_b16_rope_mixed.naver_in1k``, :mod:`.pretrained`). A name
#: without either has no weights, and ``pretrained=True`` fails at once with a clear error instead of searching the
#: Hub for a repo that does not exist. Add a row for a release, or call :func:`register_published_weights`.
PUBLISHED_WEIGHTS: dict[str, str] = {}
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

MODEL_SIZES: dict[str, dict[str, int]] = {
    "t": dict(embed_dim=192, depth=12, num_heads=3),  # ViT-Ti
    "s": dict(embed_dim=384, depth=12, num_heads=6),  # ViT-S
    "b": dict(embed_dim=768, depth=12, num_heads=12),  # ViT-B
    "l": dict(embed_dim=1024, depth=24, num_heads=16),  # ViT-L
    "m": dict(embed_dim=96, depth=4, num_heads=4),  # micro: the arrow task's (python -m lab arrows)
}
#: the arrow task's pixel statistics (``pape_hub.data.arrow_statistics`` of its default setting); a training run
#: normalises with its task's own statistics and records them in the checkpoint
ARROW_MEAN, ARROW_STD = (0.044157,) * 3, (0.171325,) * 3
PATCH_SETTINGS: dict[int, dict[str, Any]] = {
    16: dict(img_size=224, sizes="tsbl", num_classes=1000, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
    4: dict(img_size=32, sizes="ts", num_classes=10, mean=CIFAR_MEAN, std=CIFAR_STD, crop_pct=1.0),
    12: dict(img_size=48, sizes="m", num_classes=4, mean=ARROW_MEAN, std=ARROW_STD, crop_pct=1.0,
             model_args=dict(global_pool="avg", class_token=False)),
}
#: video settings by spatial patch size: clip length, tubelet, classes (ViViT-B/16x2 on Kinetics-400)
VIDEO_SETTINGS: dict[int, dict[str, Any]] = {
    16: dict(img_size=224, num_frames=16, tubelet_frames=2, sizes="tsb", num_classes=400, mean=IMAGENET_DEFAULT_MEAN,
             std=IMAGENET_DEFAULT_STD),
}
#: tokens at free 3-D coordinates (no patch setting: the key is ""): point clouds as ModelNet40 (1,024 points, 64 groups
#: of 32) and event streams as DVS Gesture (a 128 x 128 sensor, time in microseconds, 11 classes). timm's cfg keeps an
#: input_size of three numbers, (values per element, 1, typical elements), whose first is the model's in_chans
POINT_SETTINGS: dict[str, dict[str, Any]] = {
    "": dict(sizes="tsm", num_classes=40, input_size=(3, 1, 1024), first_conv="patch_embed.local.0",
             model_args=dict(num_groups=64, group_size=32)),
}
EVENT_SETTINGS: dict[str, dict[str, Any]] = {
    "": dict(sizes="tsm", num_classes=11, input_size=(4, 1, 65536), first_conv="patch_embed.proj",
             model_args=dict(sensor_size=(128, 128), event_patch_size=8, threshold=64, time_scale=20_000.0,
                             max_tokens=1024, nominal_duration=1_000_000.0)),
}
FAMILIES = {"vit": (VisionTransformer, PATCH_SETTINGS), "vivit": (VideoVisionTransformer, VIDEO_SETTINGS),
            "pointvit": (PointVisionTransformer, POINT_SETTINGS), "eventvit": (EventVisionTransformer, EVENT_SETTINGS)}
FREE_TOKEN_FAMILIES = ("pointvit", "eventvit")
FAMILY_TITLES = {"vit": "ViT", "vivit": "ViViT", "pointvit": "Point ViT", "eventvit": "Event ViT"}
SIZE_NAMES = {"m": "micro (width 96, depth 4)"}


def _family_takes(family: str, enc: str) -> bool:
    """Whether ``family`` has a model with encoding ``enc``: defined for its dimensions, and for the free-token
    families able to take free coordinates."""
    if family in FREE_TOKEN_FAMILIES:
        return free_coordinates_problem(enc, 3) is None
    return (3 if family == "vivit" else 2) in encoding_class(enc)[0].supported_ndims


def _names() -> dict[str, tuple[str, str, int | str, str]]:
    names = {}
    for family, (_, settings) in FAMILIES.items():
        for patch, setting in settings.items():
            for size in setting["sizes"]:
                for enc in list_encodings():
                    if _family_takes(family, enc):
                        names[f"{family}_{size}{patch}_{enc}"] = (family, size, patch, enc)
    return names


_MODELS = _names()


def list_pape_models(family: str | None = None) -> list[str]:
    """Every model name this package registers in timm (``family``: ``"vit"``, ``"vivit"``, ``"pointvit"`` or
    ``"eventvit"`` only)."""
    return [name for name, entry in _MODELS.items() if family in (None, entry[0])]


#: timm's own ViT sizes -> this package's size letters (a timm name is answered with its pape_hub equal)
_TIMM_SIZES = {"tiny": "t", "small": "s", "base": "b", "large": "l"}


def suggest_model(name: str) -> str:
    """One line naming the fix for an unknown model name: the pape_hub equal of a timm ViT name
    (``vit_base_patch16_224`` -> ``vit_b16_ape``), or the closest registered names."""
    import difflib
    import re

    timm_vit = re.fullmatch(r"vit_(tiny|small|base|large)_patch(\d+)_\d+(?:\..*)?", name)
    if timm_vit and f"vit_{_TIMM_SIZES[timm_vit[1]]}{timm_vit[2]}_ape" in _MODELS:
        size = _TIMM_SIZES[timm_vit[1]]
        return (f"that is timm's own ViT; pape_hub's with the same learned table is vit_{size}{timm_vit[2]}_ape (any "
                f"encoding: vit_{size}{timm_vit[2]}_<encoding>, pape_hub.list_encodings())")
    close = difflib.get_close_matches(name, list(_MODELS), n=3, cutoff=0.6)
    if close:
        return f"did you mean {', '.join(close)}? (every name: pape_hub.list_pape_models())"
    return f"e.g. {', '.join(list(_MODELS)[:4])}, ... (every name: pape_hub.list_pape_models())"


def free_token_architecture(model: PointVisionTransformer | EventVisionTransformer) -> str:
    """The registered name a point or event model is saved under: the one timm built it as, else its family, the
    size whose width and depth it has (``m`` where none has) and its encoding; ``model_args`` hold the rest."""
    built = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    if built in _MODELS:
        return built
    family = "pointvit" if isinstance(model, PointVisionTransformer) else "eventvit"
    size = next((k for k, v in MODEL_SIZES.items() if (v["embed_dim"], v["depth"]) == (model.embed_dim,
                                                                                      len(model.blocks))), "m")
    name = f"{family}_{size}_{model.pos_encoding.name}"
    return name if name in _MODELS else f"{family}_m_{model.pos_encoding.name}"


def model_args_for(name: str) -> dict[str, Any]:
    """Constructor arguments of a registered model name."""
    if name not in _MODELS:
        raise ValueError(f"unknown pape_hub model {name!r}; {suggest_model(name)}")
    family, size, patch, enc = _MODELS[name]
    setting = FAMILIES[family][1][patch]
    args = dict(num_classes=setting["num_classes"], position_encoding=enc, **MODEL_SIZES[size],
                **setting.get("model_args", {}))
    if family in FREE_TOKEN_FAMILIES:
        return args
    args["img_size"] = setting["img_size"]
    if family == "vivit":
        args.update(num_frames=setting["num_frames"], tubelet_size=(setting["tubelet_frames"], patch, patch))
    else:
        args["patch_size"] = patch
    return args


def _cfg(name: str) -> dict[str, Any]:
    family, size, patch, enc = _MODELS[name]
    setting = FAMILIES[family][1][patch]
    weights = {"hf_hub_id": PUBLISHED_WEIGHTS[name]} if name in PUBLISHED_WEIGHTS else {}
    if family in FREE_TOKEN_FAMILIES:  # no pixel statistics, no crop
        return dict(**weights, num_classes=setting["num_classes"], input_size=setting["input_size"], pool_size=None,
                    fixed_input_size=False, first_conv=setting["first_conv"], classifier="head", license="apache-2.0",
                    notes=(f"{FAMILY_TITLES[family]}-{SIZE_NAMES.get(size, size.upper())}, {enc} position encoding",))
    return dict(
        **weights, num_classes=setting["num_classes"],
        input_size=(3, setting["img_size"], setting["img_size"]), pool_size=None, crop_pct=setting.get("crop_pct", 0.9),
        interpolation="bicubic", fixed_input_size=False, mean=setting["mean"], std=setting["std"],
        first_conv="patch_embed.proj", classifier="head", license="apache-2.0",
        notes=(f"{FAMILY_TITLES[family]}-{SIZE_NAMES.get(size, size.upper())}/{patch}"
               + (f", {setting['num_frames']} frames, tubelets of {setting['tubelet_frames']}" if family == "vivit"
                  else "") + f", {enc} position encoding",),
    )


def _all_cfgs() -> dict[str, dict[str, Any]]:
    """Every name's own cfg, then its tags: the public checkpoints it converts, each with the source's data config.
    See :func:`_generate_cfgs` for which is the default."""
    cfgs = {name: _cfg(name) for name in _MODELS}
    for name_with_tag in SOURCES:
        name = name_with_tag.split(".")[0]
        cfgs[name_with_tag] = {**_cfg(name), **source_cfg(name_with_tag)}
    return cfgs


def _generate_cfgs(cfgs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """timm's ``generate_default_cfgs``, with the untagged cfg kept as the default (timm would promote the first tag
    with weights): ``vit_b16_ape`` stays the random init it always was, and a checkpoint is asked for by its tag."""
    out = generate_default_cfgs(cfgs)
    for default_cfg in out.values():
        if "" in default_cfg.tags:
            default_cfg.tags.remove("")
            default_cfg.tags.appendleft("")
    return out


default_cfgs = _generate_cfgs(_all_cfgs())


def list_pretrained(pattern: str = "") -> list[str]:
    """Every ``name.tag`` with weights: converted public checkpoints and :data:`PUBLISHED_WEIGHTS`
    (``pattern``: a substring, e.g. ``"rope"``)."""
    names = sorted([*SOURCES, *PUBLISHED_WEIGHTS])
    return [name for name in names if pattern in name]


#: checks of a checkpoint folder's config.json run before timm builds from it: (config, where) -> raise if wrong. The
#: transformers face adds one (the file's transformers fields must describe the model its timm fields do); the core
#: imports nothing of the faces.
SOURCE_CONFIG_CHECKS: list[Callable[[dict[str, Any], str], None]] = []


def _source_files(cfg: dict[str, Any], pretrained: bool) -> tuple[Path, list[Path] | None]:
    """(config.json, the safetensors shards of a sharded save or None) of a ``local-dir:`` / ``hf-hub:`` source, at
    its revision (``hf-hub:org/repo@REV``, as timm splits it). With ``pretrained``, the weights are fetched now (into
    the cache, where timm's own download finds them next)."""
    from ..folder import WEIGHTS, WEIGHTS_INDEX, index_shards

    if cfg.get("source") == "local-dir":
        folder = Path(cfg["file"])
        sharded = pretrained and not (folder / WEIGHTS).exists() and (folder / WEIGHTS_INDEX).exists()
        return folder / "config.json", index_shards(folder / WEIGHTS_INDEX, lambda n: folder / n) if sharded else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError
    from timm.models._hub import hf_split

    repo_id, revision = hf_split(cfg["hf_hub_id"])
    fetch = partial(hf_hub_download, repo_id, revision=revision)
    path = Path(fetch("config.json"))  # already in the cache: timm just read it
    if not pretrained:
        return path, None
    try:
        fetch(WEIGHTS)
        return path, None
    except EntryNotFoundError:
        pass
    try:
        index = Path(fetch(WEIGHTS_INDEX))
    except EntryNotFoundError:
        return path, None  # timm falls back to pytorch_model.bin, which it reads with weights_only=True
    return path, index_shards(index, lambda name: Path(fetch(name)))


def _check_source_config(pretrained_cfg: Any, pretrained: bool) -> list[Path] | None:
    """``timm.create_model("local-dir:..." / "hf-hub:...")`` reads ``model_args`` from the folder's config.json;
    run :data:`SOURCE_CONFIG_CHECKS` on the file (with ``pretrained``, the weights are fetched first, so that the
    checks compare them with the config before timm builds anything). Returns the shards of a sharded save (which
    timm alone would read one of), else None."""
    cfg = pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else dict(pretrained_cfg or {})
    if not ((cfg.get("source") == "local-dir" and cfg.get("file")) or
            (cfg.get("source") == "hf-hub" and cfg.get("hf_hub_id"))):
        return None
    path, shards = _source_files(cfg, pretrained)
    config = json.loads(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object of model settings, got a JSON {type(config).__name__}")
    for check in SOURCE_CONFIG_CHECKS:
        check(config, str(path))
    return shards


def _has_weights(pretrained_cfg: Any) -> bool:
    return any(getattr(pretrained_cfg, k) for k in ("hf_hub_id", "url", "file", "state_dict"))


def _check_hub_reachable(cfg: Any, name: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, naming the ways out, where weights must come from a Hub that cannot be reached (no network):
    huggingface_hub would retry for about a minute and end in a generic "check your connection". Nothing is checked
    where the weights are cached, a file is given, the Hub is offline by choice (``HF_HUB_OFFLINE``) or a proxy is
    set (a direct connection says nothing about the proxy's)."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache
    from timm.models._hub import HF_OPEN_CLIP_SAFE_WEIGHTS_NAME, HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME, hf_split

    if not cfg.hf_hub_id or cfg.file or cfg.state_dict or constants.HF_HUB_OFFLINE or any(
            os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return
    repo_id, revision = hf_split(cfg.hf_hub_id)
    # the weights files timm looks for, in its order: any of them cached means no network is needed
    files = [cfg.hf_hub_filename] if cfg.hf_hub_filename else [HF_OPEN_CLIP_SAFE_WEIGHTS_NAME, HF_SAFE_WEIGHTS_NAME,
                                                               HF_WEIGHTS_NAME]
    if any(isinstance(try_to_load_from_cache(repo_id, f, revision=revision), str) for f in files):
        return
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        raise OSError(
            f"{name}'s weights come from the Hub repo {repo_id}, but {constants.ENDPOINT} cannot be reached ({err}) "
            "and they are not in the cache. Offline, any of: set HF_HUB_OFFLINE=1 where the files are already cached "
            "(huggingface-cli download " + repo_id + " on a connected machine, then copy ~/.cache/huggingface); "
            "load a folder with timm.create_model('local-dir:PATH'); give a downloaded weights file with "
            "pretrained_cfg_overlay=dict(file='PATH'); or set HF_ENDPOINT to a mirror you can reach") from None


def _create(name: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    # the cfg timm will load from (a tag, a dict, or hf-hub:/local-dir:, with the overlay applied)
    cfg = resolve_pretrained_cfg(name, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"))
    if pretrained and not _has_weights(cfg):
        tags = [n for n in list_pretrained() if n.split(".")[0] == name]
        have = f"its tags with weights: {', '.join(tags)}" if tags else "no tag of it has any"
        raise ValueError(f"{name}{'.' + cfg.tag if cfg.tag else ''} has no weights ({have}; every one: "
                         "pape_hub.list_pretrained()). Load a "
                         "checkpoint with timm.create_model('hf-hub:ORG/REPO') or 'local-dir:PATH', or use "
                         "pretrained=False")
    if pretrained and cfg.source not in ("hf-hub", "local-dir"):  # those read their config first, through timm
        _check_hub_reachable(cfg, f"{name}.{cfg.tag}" if cfg.tag else name)
    shards = _check_source_config(cfg, pretrained)
    if shards is not None:  # timm reads one weights file: hand it the whole sharded state as its state_dict source
        from ..folder import read_weights

        origin = cfg.source
        cfg = replace(cfg, source="", state_dict=read_weights(shards))
        kwargs["pretrained_cfg"] = cfg
    source = SOURCES.get(f"{name}.{cfg.tag}")
    kwargs = {**(source.model_args if source else {}), **kwargs}
    out_indices = kwargs.pop("out_indices", 3)
    # timm's factory passes where and in which dtype to build: every tensor is made there (meta included)
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    with torch.device(device) if device is not None else nullcontext():
        model = build_model_with_cfg(
            FAMILIES[_MODELS[name][0]][0], name, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
            feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
            **{**model_args_for(name), **kwargs},
        )
    if source:  # timm records the caller's kwargs as the model's arguments; the entry's own belong there too
        model._model_args = dict(source.model_args)
    if shards is not None:  # the cfg kept on the model says where the weights came from, and holds no tensors
        model.pretrained_cfg = {**model.pretrained_cfg, "state_dict": None, "source": origin}
    return model.to(dtype=dtype) if dtype is not None else model


def _entrypoint(name: str) -> Callable[..., VisionTransformer]:
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
        return _create(name, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"{default_cfgs[name].default.notes[0]} (pape_hub)."
    return entrypoint


for _name in _MODELS:
    globals()[_name] = register_model(_entrypoint(_name))


def register_published_weights(name: str, repo_id: str) -> None:
    """Declare that ``repo_id`` holds weights of the registered model ``name`` (as :data:`PUBLISHED_WEIGHTS`
    does for a release): ``timm.create_model(name, pretrained=True)`` then downloads them."""
    import warnings

    if name not in _MODELS:
        raise ValueError(f"unknown pape_hub model {name!r}")
    PUBLISHED_WEIGHTS[name] = repo_id
    default_cfgs.update(_generate_cfgs({k: v for k, v in _all_cfgs().items() if k.split('.')[0] == name}))
    with warnings.catch_warnings():  # timm warns that it overwrites the registration: that is the point
        warnings.simplefilter("ignore")
        globals()[name] = register_model(_entrypoint(name))
