"""Public ImageNet checkpoints of other ViTs that are pape_hub models, converted on the fly.

A row of :data:`SOURCES` says: the pape_hub model ``name.tag`` *is* that public checkpoint (timm's Hub copy, in
timm's key layout) given these extra constructor arguments. Its pretrained cfg (repo id, mean, std, crop,
interpolation, licence, classes) is the source's own, read from timm's registry, so nothing is retyped.

:func:`checkpoint_filter_fn` is timm's ``pretrained_filter_fn``. :func:`detect_family` names a state dict's source
family by sentinel keys (as timm's ``vision_transformer.checkpoint_filter_fn`` and ``eva.checkpoint_filter_fn`` do),
and the family's own converter (:data:`CONVERTERS`) renames its backbone keys and places its position weights where
the model's encoding keeps the same thing. What every family shares (LayerScale folding, register tokens, qkv
biases, the model's own position weights where the source has none) runs once after it in
:func:`convert_state_dict`. Position weights the model's encoding has no slot for are left out and the model keeps
its own freshly initialised ones ("transplant"): any ViT checkpoint can seed any encoding, and :class:`Conversion`
says what was copied, converted and new. A converter asks the model's encoding what it is by its class, never by
its name, so a new encoding of an existing kind (another RoPE-Mixed variant) needs no converter change.

Families (the conventions, measured against each source built by its own code, are in ``docs/pretrained.md``,
"Source conventions"):

- ``timm_vit`` (timm's ``VisionTransformer``: ViT augreg, DeiT, DeiT-III, MAE): our keys, except the learned table
  ``pos_embed`` (DeiT-III's has no CLS row: CLS gets a zero row, which adds nothing) and LayerScale
  ``blocks.i.ls{1,2}.gamma`` (same keys as ours).
- ``naver_rope`` (timm's ``Eva`` with NaverLabs' rope-vit weights): ``blocks.i.gamma_{1,2}`` are our
  ``ls{1,2}.gamma``; RoPE-Mixed's ``rope.freqs`` is (2 [x, y], depth, heads, head_dim/2), ours (depth, heads, 2,
  head_dim/2); axial RoPE's fixed buffers are recomputed, not loaded; the ``*_ape`` models' ``pos_embed`` (patch
  cells only) is our ``absolute.pos_embed``.
- ``dinov3`` (timm's ``Eva`` with ``reg_token``): Eva's keys; into :class:`~pape_hub.encodings.DINOv3RoPE` its q/k
  channels are permuted from rotate-half, y first, to interleaved, x first (:func:`dinov3_qk_order`); it has no
  qkv bias.
- ``lookhere`` (LookHere's official release, ``{"config", "weights"}``): DeiT-III's keys plus ``head.fc1`` /
  ``head.fc2``, our ``pre_logits.fc`` / ``head``; into :class:`~pape_hub.encodings.LookHere` the file's config must
  be the model's encoding, and the heads move from the release's corner order to ours (:func:`lookhere_head_order`,
  :func:`permute_heads`).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from timm.models import get_pretrained_cfg
from torch import nn

from ..encodings import DINOv3RoPE, LookHere, RoPEMixed
from ..encodings.absolute import resample_table
from .vit import init_prefix_token
from .weights import check_finite_weights

__all__ = ["CONVERTERS", "SOURCES", "Conversion", "Source", "build_source", "checkpoint_filter_fn",
           "convert_state_dict", "detect_family", "source_cfg", "transplant"]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """One public checkpoint: timm's ``name.tag`` of it, or the pretrained-cfg fields of a release timm does not list,
    and what the pape_hub model needs to be exactly it."""

    timm_name: str | None  # e.g. "deit3_small_patch16_224.fb_in1k"; its hf_hub_id is timm's Hub copy
    model_args: dict[str, Any] = field(default_factory=dict)  # extra constructor arguments (LayerScale, classes)
    paper: str = ""
    release_cfg: dict[str, Any] = field(default_factory=dict)  # without a timm name: where the file is, its data cfg
    reported: dict[str, Any] = field(default_factory=dict)  # the source's own ImageNet figures, cited (REPORTED)

    @property
    def label(self) -> str:
        """How the source is named: timm's name, or the release's repo and file."""
        return self.timm_name or f"{self.release_cfg['hf_hub_id']}/{self.release_cfg['hf_hub_filename']}"


#: LookHere's ViT-B/16 LH-90 release (GreenCUBIC/lookhere): the official .pth of weights and config. Its evaluation
#: transform (the repo's data_prep.py): resize the short side to 256 (torchvision's bilinear, antialiased), centre
#: crop 224, ImageNet mean/std. The code is MIT-licensed; the weights' own terms are on their Hub repo.
LOOKHERE_LH90 = dict(
    hf_hub_id="antofuller/LookHere", hf_hub_filename="LH_90_weights_and_config.pth", input_size=(3, 224, 224),
    interpolation="bilinear", crop_pct=0.875, crop_mode="center", mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225), num_classes=1000, origin_url="https://github.com/GreenCUBIC/lookhere",
    paper_ids="arXiv:2405.13985",
)


_TIMM_SIZES = {"t": "tiny", "s": "small", "b": "base", "l": "large"}


def _timm_cfg(name_with_tag: str) -> Any:
    """timm's pretrained cfg of ``name.tag``, None where timm has no such tag."""
    try:
        return get_pretrained_cfg(name_with_tag)
    except RuntimeError:  # timm's "Invalid pretrained tag"
        return None


#: ImageNet-1k top-1 (%) the sources report for their released models, by input size: cited, never measured here.
#: naver-ai/rope-vit's README and Heo et al. 2024 (DeiT-III recipe, 400 epochs; as summarised in
#: ``docs/pretrained.md``, "Reported figures"). The other sources' figures are on their own cards, which are not
#: reachable from here, so they are not restated.
REPORTED = {
    "vit_s16_rope.naver_in1k": {224: 80.9, 384: 80.0}, "vit_s16_rope_mixed.naver_in1k": {224: 80.9, 384: 81.8},
    "vit_b16_rope.naver_in1k": {224: 83.6, 384: 83.9}, "vit_b16_rope_mixed.naver_in1k": {224: 83.8, 384: 84.4},
}
_REPORTED_BY = "naver-ai/rope-vit README (Heo et al. 2024), ImageNet-1k validation top-1, trained at 224 px"
_REPORTED_URL = "https://github.com/naver-ai/rope-vit"


def _sources() -> dict[str, Source]:
    """``vit_{size}16_{encoding}.{tag}`` -> source, for every source timm's registry holds. The model takes the
    source's class count (ImageNet-21k's 21843, MAE's headless encoder)."""
    rows: dict[str, Source] = {}

    def add(size: str, encoding: str, tag: str, timm_name: str, paper: str, **model_args: Any) -> None:
        cfg = _timm_cfg(timm_name)
        if cfg is not None and cfg.hf_hub_id:
            entry = f"vit_{size}16_{encoding}.{tag}"
            reported = dict(top1_by_size=REPORTED[entry], by=_REPORTED_BY, url=_REPORTED_URL) \
                if entry in REPORTED else {}
            rows[entry] = Source(timm_name, dict(model_args, num_classes=cfg.num_classes), paper, reported=reported)

    for size, timm_size in _TIMM_SIZES.items():
        vit, deit, deit3 = (f"{family}_{timm_size}_patch16_224" for family in ("vit", "deit", "deit3"))
        for tag in ("augreg2_in21k_ft_in1k", "augreg_in21k_ft_in1k", "augreg_in1k", "augreg_in21k"):
            add(size, "ape", tag, f"{vit}.{tag}", "How to train your ViT? (Steiner et al. 2021)")
        add(size, "ape", "fb_in1k", f"{deit}.fb_in1k", "DeiT (Touvron et al. 2021)")
        for tag in ("fb_in1k", "fb_in22k_ft_in1k"):
            add(size, "ape", f"fb_deit3_{tag.removeprefix('fb_')}", f"{deit3}.{tag}", "DeiT III (Touvron et al. 2022)",
                init_values=1e-6)
        add(size, "ape", "mae", f"{vit}.mae", "MAE (He et al. 2022), encoder")
        for encoding in ("rope", "rope_mixed", "rope_ape", "rope_mixed_ape"):
            add(size, encoding, "naver_in1k", f"vit_{timm_size}_patch16_{encoding}_224.naver_in1k",
                "Rotary Position Embedding for Vision Transformer (Heo et al. 2024)", init_values=1e-5)
        # DINOv3 (timm's Eva): CLS + 4 registers, LayerScale, eps 1e-5, no qkv bias, timm's average pooling over the
        # patches (DINOv3's own features are the CLS token: global_pool="token")
        dinov3 = dict(reg_tokens=4, init_values=1e-5, norm_eps=1e-5, qkv_bias=False, global_pool="avg", fc_norm=False,
                      img_size=256)
        add(size, "rope_dinov3", "lvd1689m", f"vit_{timm_size}_patch16_dinov3.lvd1689m",
            "DINOv3 (Simeoni et al. 2025)", **dinov3)
        # S+: the S size with a SwiGLU MLP (timm's Eva swiglu_mlp); H+ and 7B have no size of this package
        add(size, "rope_dinov3", "lvd1689m_plus", f"vit_{timm_size}_plus_patch16_dinov3.lvd1689m",
            "DINOv3 (Simeoni et al. 2025), the Plus model", swiglu_mlp=True, **dinov3)
    # the release's pre-logits head (Linear(768, 3072) -> tanh), nn.LayerNorm's eps and its bias rounding
    rows["vit_b16_lookhere.lh90_in1k"] = Source(None, dict(
        num_classes=1000, init_values=1e-4, norm_eps=1e-5, representation_size=3072,
        position_encoding_kwargs=dict(bias_rounding="bfloat16")),
        "LookHere: Vision Transformers with Directed Attention Generalize and Extrapolate (Fuller et al. 2024), LH-90",
        LOOKHERE_LH90)
    return rows


#: ``name.tag`` -> the public checkpoint it converts
SOURCES: dict[str, Source] = _sources()


def source_cfg(name_with_tag: str) -> dict[str, Any]:
    """The pretrained-cfg fields of a converted entry, from the source's own cfg in timm's registry: where its
    weights are (timm's Hub copy) and how its inputs were prepared (mean, std, crop, interpolation) and licensed."""
    source = SOURCES[name_with_tag]
    if source.timm_name is None:
        return dict(source.release_cfg, paper_name=source.paper,
                    notes=(f"converted on the fly from {source.label} (the release's own file)",))
    cfg = _timm_cfg(source.timm_name).to_dict()
    keep = ("hf_hub_id", "input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std", "num_classes",
            "license", "origin_url", "paper_ids")
    fields = {k: cfg[k] for k in keep if cfg.get(k) is not None}
    fields["paper_name"] = source.paper
    fields["notes"] = (f"converted on the fly from {source.timm_name} (timm's Hub copy of the source's weights)",)
    return fields


# --- conversion -----------------------------------------------------------------------------------------------

@dataclass
class Conversion:
    """What a conversion did: tensors copied as they are, converted (renamed, permuted, padded, resampled),
    taken from the model's own initialisation (position weights the source lacks), and left out."""

    family: str  # the source family (a key of CONVERTERS) or "pape_hub"
    copied: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)
    own_init: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{self.family} checkpoint: {len(self.copied)} tensors copied"]
        if self.converted:
            parts.append(f"converted {', '.join(self.converted)}")
        if self.own_init:
            parts.append(f"new (the model's own init) {', '.join(self.own_init)}")
        if self.dropped:
            parts.append(f"left out {', '.join(self.dropped)}")
        return "; ".join(parts)


def detect_family(state: dict[str, torch.Tensor], model: nn.Module) -> str:
    """``"pape_hub"`` (this package's keys, also the transformers face's ``vit.``-prefixed ones) or a source family
    of :data:`CONVERTERS`, by sentinel keys."""
    own = set(model.state_dict())
    if {k.removeprefix("vit.") for k in state} <= own | {"head.weight", "head.bias"}:
        return "pape_hub"
    if "blocks.0.gamma_1" in state or "rope.freqs" in state:  # timm's Eva
        return "dinov3" if "reg_token" in state else "naver_rope"
    if "head.fc1.weight" in state and "blocks.0.ls1.gamma" in state:
        return "lookhere"
    if "blocks.0.attn.qkv.weight" in state and "patch_embed.proj.weight" in state:
        return "timm_vit"
    raise ValueError("unrecognised checkpoint layout: neither pape_hub's keys nor a timm ViT / Eva state dict "
                     f"(first keys: {list(state)[:6]})")


def fit_table(table: torch.Tensor, own: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
    """A learned table (1, P' + N', D) of a square grid -> the shape of the model's table ``own``, (1, P + N, D) at
    ``grid``: prefix rows kept, dropped, or zero where the source has none (DeiT-III, Naver ``*_ape``: CLS gets no
    position vector, and adding zero is that); cells resampled bicubically to the model's grid. A table of no
    square grid (after the model's prefix rows, none or one) is refused: its rows cannot be laid out without its
    grid."""
    num_prefix = own.shape[1] - math.prod(grid)
    if table.ndim != 3 or table.shape[0] != 1 or table.shape[1] == 0 or table.shape[2] != own.shape[2]:
        raise ValueError(f"the source's pos_embed has shape {tuple(table.shape)}; a learned table is (1, rows, "
                         f"{own.shape[2]}) for this model's width")
    rows = table.shape[1]
    source_prefix = next((p for p in (num_prefix, 0, 1) if p < rows and math.isqrt(rows - p) ** 2 == rows - p), None)
    if source_prefix is None:
        raise ValueError(f"the source's pos_embed has {rows} rows: not a square grid after {num_prefix}, 0 or 1 "
                         "prefix rows, so its cells cannot be placed (a non-square source grid)")
    side = math.isqrt(rows - source_prefix)
    cells = table[:, source_prefix:]
    prefix = table[:, :num_prefix] if source_prefix >= num_prefix else torch.cat(
        [table[:, :source_prefix], table.new_zeros(1, num_prefix - source_prefix, table.shape[-1])], dim=1)
    return resample_table(torch.cat([prefix, cells], dim=1), grid, (side, side), num_prefix)


def _learned_table(state: dict[str, torch.Tensor], model: nn.Module, report: Conversion) -> dict[str, torch.Tensor]:
    """The source's learned table ``pos_embed`` as the model's own table (the ``ape`` encoding's, or the one an
    ``*_ape`` encoding adds), fitted to the model's grid; left out for an encoding without a table."""
    if "pos_embed" not in state:
        return {}
    encoding = model.pos_encoding
    own = dict(encoding.named_parameters())
    table = next((name for name in ("pos_embed", "absolute.pos_embed") if name in own), None)
    if table is None:
        report.dropped.append("pos_embed (learned table)")
        return {}
    report.converted.append(f"pos_embed -> pos_encoding.{table}")
    return {f"pos_encoding.{table}": fit_table(state["pos_embed"], own[table], tuple(encoding.ctx.grid_size))}


def fold_layer_scale(state: dict[str, torch.Tensor], model: nn.Module, report: Conversion) -> dict[str, torch.Tensor]:
    """LayerScale gains of a model built without LayerScale, folded into the layer before them: ``gamma * (W x + b)``
    is ``(gamma W) x + gamma b``, so ``ls1`` scales ``attn.proj`` and ``ls2`` scales ``mlp.fc2`` (exact up to one
    rounding per weight)."""
    own = model.state_dict()
    out = dict(state)
    gains = [k for k in state if k.endswith((".ls1.gamma", ".ls2.gamma")) and k not in own]
    for key in gains:
        block, branch, _ = key.rsplit(".", 2)
        layer = f"{block}.attn.proj" if branch == "ls1" else f"{block}.mlp.fc2"
        gamma = out.pop(key)
        out[f"{layer}.weight"] = out[f"{layer}.weight"] * gamma[:, None]
        out[f"{layer}.bias"] = out[f"{layer}.bias"] * gamma
    if gains:
        report.converted.append(f"{len(gains)} LayerScale gains folded into attn.proj / mlp.fc2")
    return out


def _own_position_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's own position tensors as its init makes them; on the meta device, a real initialised copy."""
    encoding = model.pos_encoding
    if any(t.is_meta for t in encoding.state_dict().values()):
        encoding = copy.deepcopy(encoding).to_empty(device="cpu")
        encoding.reset_parameters()
    return {f"pos_encoding.{k}": v for k, v in encoding.state_dict().items()}


def _add_own_positions(out: dict[str, torch.Tensor], model: nn.Module, report: Conversion) -> None:
    """Give ``out`` the model's own initialised position tensors where it has none; parameters count as new."""
    parameters = {name for name, _ in model.named_parameters()}
    for key, value in _own_position_state(model).items():
        if key not in out:
            out[key] = value
            if key in parameters:
                report.own_init.append(key)


def files_overlay(model_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The pretrained-cfg overlay for size arguments that describe the source's files too: a ``num_classes`` there
    is the files' head, so timm keeps it instead of dropping it as another class count."""
    return {"num_classes": model_kwargs["num_classes"]} if "num_classes" in model_kwargs else None


def unwrap(file: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """A file's state dict and the configuration it carries: timm and DeiT files may hold ``{"model": ...}``,
    LookHere's release ``{"config": ..., "weights": ...}``."""
    if isinstance(file.get("weights"), dict) and isinstance(file.get("config"), dict):
        return file["weights"], file["config"]
    return (file["model"] if isinstance(file.get("model"), dict) else file), None


# --- LookHere's release ---------------------------------------------------------------------------------------

#: the release's head directions (``lookhere_reference.official_heads``) -> this package's view names
_LOOKHERE_VIEWS = {
    ("up", "left"): "top_left", ("up", "right"): "top_right", ("down", "left"): "bottom_left",
    ("down", "right"): "bottom_right", ("tri_up",): "up", ("tri_down",): "down", ("tri_left",): "left",
    ("tri_right",): "right", ("up",): "up_half", ("down",): "down_half", ("left",): "left_half",
    ("right",): "right_half", (): "none",
}


def lookhere_head_order(config: dict[str, Any], encoding: nn.Module) -> list[int]:
    """For each head of the model's LookHere encoding, the release's head with the same view and slope. The release
    orders corner heads top-left, top-right, bottom-left, bottom-right; this package top-left, bottom-right,
    top-right, bottom-left (opposite views first, so that two heads still look both ways)."""
    from .lookhere_reference import official_heads

    given = dict(config, layer_slopes=list(config.get("layer_slopes") or []))  # a tuple or list in the file
    ours = (("head directions", "head_directions", encoding.head_directions),
            ("global slope", "global_slope", encoding.global_slope),
            ("layer slopes", "layer_slopes", list(encoding.layer_slope_range)),
            ("distance", "distance", "linear"), ("out-of-view fill", "fill_with", "inf"))  # the only ones built here
    defaults = {"distance": "linear", "fill_with": "inf"}  # the release's, where a file does not say
    mismatched = [f"{name} {given.get(key, defaults.get(key))!r} (the model's {value!r})" for name, key, value in ours
                  if given.get(key, defaults.get(key)) != value]
    if mismatched:
        raise ValueError("the LookHere checkpoint's configuration differs from the model's encoding: "
                         + "; ".join(mismatched) + " - build the model with position_encoding_kwargs to match")
    theirs = [(_LOOKHERE_VIEWS[directions], encoding.global_slope * slope)
              for directions, slope in official_heads(config["head_directions"], encoding.ctx.num_heads)]
    order = []
    for view, slope in zip(encoding.views, encoding.head_slopes.tolist()):
        match = next((i for i, (v, s) in enumerate(theirs) if v == view and math.isclose(s, slope, rel_tol=1e-6)
                      and i not in order), None)  # the model's slopes are a float32 buffer
        if match is None:
            raise ValueError(f"the model's LookHere head ({view}, slope {slope}) has no match in the checkpoint's "
                             f"{config['head_directions']!r} heads")
        order.append(match)
    return order


def permute_heads(state: dict[str, torch.Tensor], order: list[int], depth: int) -> dict[str, torch.Tensor]:
    """Reorder the attention heads of every block: head h of the result is head ``order[h]`` of ``state``. The
    heads' q, k and v rows of ``qkv`` and their input columns of ``proj`` move together, so the function computed
    is the same with the heads renumbered."""
    out = dict(state)
    heads = len(order)
    for i in range(depth):
        qkv, proj = f"blocks.{i}.attn.qkv", f"blocks.{i}.attn.proj.weight"
        weight = out[f"{qkv}.weight"]  # (3 * H * hd, D): rows ordered (q/k/v, head, channel)
        out[f"{qkv}.weight"] = weight.reshape(3, heads, -1, weight.shape[-1])[:, order].reshape(weight.shape)
        if f"{qkv}.bias" in out:
            bias = out[f"{qkv}.bias"]
            out[f"{qkv}.bias"] = bias.reshape(3, heads, -1)[:, order].reshape(bias.shape)
        columns = out[proj]  # (D, H * hd): columns ordered (head, channel)
        out[proj] = columns.reshape(columns.shape[0], heads, -1)[:, order].reshape(columns.shape)
    return out


def dinov3_qk_order(head_dim: int) -> list[int]:
    """For each q/k channel of this package's RoPE layout, DINOv3's channel. Ours: interleaved pairs (2j, 2j + 1),
    x frequencies first; DINOv3's: rotate-half pairs (i, i + hd/2), y frequencies first. Pair j of ours is DINOv3's
    pair i = j + hd/4 (x) or j - hd/4 (y)."""
    quarter, half = head_dim // 4, head_dim // 2
    order = []
    for j in range(half):
        i = j + quarter if j < quarter else j - quarter
        order += [i, i + half]
    return order


def permute_qk_channels(state: dict[str, torch.Tensor], order: list[int], num_heads: int, depth: int
                        ) -> dict[str, torch.Tensor]:
    """Reorder the channels of every head's queries and keys (the same order for both, so q . k is unchanged);
    values stay."""
    out = dict(state)
    for i in range(depth):
        for name in (f"blocks.{i}.attn.qkv.weight", f"blocks.{i}.attn.qkv.bias"):
            if name in out:
                t = out[name].reshape(3, num_heads, len(order), *out[name].shape[1:])  # (q/k/v, head, channel, ...)
                out[name] = torch.cat([t[:2, :, order], t[2:]]).reshape(out[name].shape)
    return out


def _zero_qkv_biases(out: dict[str, torch.Tensor], model: nn.Module, report: Conversion) -> None:
    """A source without qkv biases (DINOv3) into a model with them: zero biases compute the same."""
    own = model.state_dict()
    missing = [k for k in own if k.endswith("attn.qkv.bias") and k not in out and k[:-4] + "weight" in out]
    for key in missing:
        out[key] = torch.zeros(own[key].shape, dtype=out[key[:-4] + "weight"].dtype)
    if missing:
        report.converted.append(f"{len(missing)} qkv biases set to zero (the source has none)")


def _registers(out: dict[str, torch.Tensor], model: nn.Module, report: Conversion) -> None:
    """Register tokens: left out for a model without them; the model's own for a source without them."""
    own = model.state_dict()
    if "reg_token" in out and "reg_token" not in own:
        out.pop("reg_token")
        report.dropped.append("reg_token (register tokens; the model has none)")
    elif "reg_token" in own and "reg_token" not in out:
        value = own["reg_token"]
        if value.is_meta:  # built on the meta device: a real tensor by the model's own rule
            value = init_prefix_token(torch.empty(value.shape, dtype=value.dtype))
        out["reg_token"] = value
        report.own_init.append("reg_token")


def _lookhere_release(out: dict[str, torch.Tensor], config: dict[str, Any] | None, model: nn.Module,
                      report: Conversion) -> dict[str, torch.Tensor]:
    """The release into a LookHere model: heads into this package's order, after checking that the file's
    configuration is the model's. Into a model without a pre-logits layer: the head is left out."""
    if isinstance(model.pos_encoding, LookHere):
        if config is None:
            raise ValueError("a LookHere state dict without its configuration: load the release file itself "
                             "({'config': ..., 'weights': ...}), whose config fixes the heads' order")
        order = lookhere_head_order(config, model.pos_encoding)
        if order != sorted(order):
            out = permute_heads(out, order, len(model.blocks))
            report.converted.append(f"attention heads reordered {order} (the release's corner order)")
    own = model.state_dict()
    if "pre_logits.fc.weight" not in own:
        for key in [k for k in out if k.startswith(("pre_logits.", "head."))]:
            out.pop(key)
            report.dropped.append(f"{key} (the release's pre-logits head; the model has none)")
        out.update({k: v for k, v in own.items() if k.startswith("head.") and not v.is_meta})
        report.own_init += [k for k in own if k.startswith("head.")]
    return out


# --- one converter per source family ---------------------------------------------------------------------------
# Each takes (the source's state dict, the configuration its file carries, the model, the report) and returns the
# source's tensors under the model's keys; convert_state_dict does what all families share.

def _convert_timm_vit(state: dict[str, torch.Tensor], config: dict[str, Any] | None, model: nn.Module,
                      report: Conversion) -> dict[str, torch.Tensor]:
    """timm's ``VisionTransformer`` (ViT augreg, DeiT, DeiT-III, MAE): our keys but the learned table."""
    backbone = {k: v for k, v in state.items() if k != "pos_embed"}
    report.copied = sorted(backbone)
    return {**backbone, **_learned_table(state, model, report)}


def _eva_backbone(state: dict[str, torch.Tensor], report: Conversion) -> dict[str, torch.Tensor]:
    """timm's ``Eva`` keys as ours: ``gamma_1/2`` are ``ls1/2.gamma``; position tensors (``pos_embed``, ``rope.*``)
    are the families' to place, and Eva's fixed sin/cos buffers are recomputed by the encoding, not loaded."""
    backbone = {k.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma"): v for k, v in state.items()
                if k != "pos_embed" and not k.startswith("rope.")}
    report.copied = sorted(backbone)
    report.converted.append("blocks.*.gamma_1/2 -> blocks.*.ls1/2.gamma")
    return backbone


def _convert_naver_rope(state: dict[str, torch.Tensor], config: dict[str, Any] | None, model: nn.Module,
                        report: Conversion) -> dict[str, torch.Tensor]:
    """NaverLabs' rope-vit (timm's ``Eva``): RoPE-Mixed's learned frequencies into a RoPE-Mixed encoding, the
    ``*_ape`` models' table into the model's table."""
    out = {**_eva_backbone(state, report), **_learned_table(state, model, report)}
    freqs = state.get("rope.freqs")
    if freqs is not None and isinstance(model.pos_encoding, RoPEMixed) and freqs.ndim == 4:
        out["pos_encoding.freqs"] = freqs.permute(1, 2, 0, 3)  # (2, L, H, K) -> (L, H, 2, K)
        report.converted.append("rope.freqs -> pos_encoding.freqs")
    elif freqs is not None:
        report.dropped.append("rope.freqs (RoPE-Mixed frequencies)")
    return out


def _convert_dinov3(state: dict[str, torch.Tensor], config: dict[str, Any] | None, model: nn.Module,
                    report: Conversion) -> dict[str, torch.Tensor]:
    """DINOv3 (timm's ``Eva`` with registers): into DINOv3's RoPE, q/k channels from its rotate-half, y-first
    layout to this package's interleaved, x-first one (any other encoding takes the backbone as it is)."""
    out = {**_eva_backbone(state, report), **_learned_table(state, model, report)}
    if isinstance(model.pos_encoding, DINOv3RoPE):
        ctx = model.pos_encoding.ctx
        out = permute_qk_channels(out, dinov3_qk_order(ctx.head_dim), ctx.num_heads, ctx.depth)
        report.converted.append("q/k channels from DINOv3's rotate-half, y-first layout to interleaved, x-first")
    return out


def _convert_lookhere(state: dict[str, torch.Tensor], config: dict[str, Any] | None, model: nn.Module,
                      report: Conversion) -> dict[str, torch.Tensor]:
    """LookHere's official release: DeiT-III's keys and a pre-logits MLP head (fc1 -> tanh -> fc2)."""
    backbone = {k.replace("head.fc1.", "pre_logits.fc.").replace("head.fc2.", "head."): v
                for k, v in state.items() if k != "pos_embed"}
    report.copied = sorted(backbone)
    report.converted.append("head.fc1 -> pre_logits.fc, head.fc2 -> head")
    return _lookhere_release({**backbone, **_learned_table(state, model, report)}, config, model, report)


Converter = Callable[[dict[str, torch.Tensor], dict[str, Any] | None, nn.Module, Conversion], dict[str, torch.Tensor]]

#: source family -> its converter (:func:`detect_family` names the family of a state dict)
CONVERTERS: dict[str, Converter] = {
    "timm_vit": _convert_timm_vit,
    "naver_rope": _convert_naver_rope,
    "dinov3": _convert_dinov3,
    "lookhere": _convert_lookhere,
}


def convert_state_dict(state: dict[str, Any], model: nn.Module) -> tuple[dict[str, Any], Conversion]:
    """A checkpoint of this package or of any source family -> the model's keys, and what was done: the family's
    converter, then what all share (LayerScale folded where the model has none, registers, qkv biases, the
    model's own position weights where the source has none of its kind)."""
    state, file_config = unwrap(state)
    family = detect_family(state, model)
    if family == "pape_hub":
        out = {k.removeprefix("vit."): v for k, v in state.items()}
        check_finite_weights(out, "the pape_hub checkpoint")
        return out, Conversion(family, copied=list(out))
    report = Conversion(family)
    out = fold_layer_scale(CONVERTERS[family](state, file_config, model, report), model, report)
    _add_own_positions(out, model, report)
    _registers(out, model, report)
    _zero_qkv_biases(out, model, report)
    check_finite_weights(out, f"the {family} checkpoint")
    return out, report


def checkpoint_filter_fn(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, Any]:
    """timm's ``pretrained_filter_fn``: :func:`convert_state_dict`, logging what a foreign checkpoint gave."""
    out, report = convert_state_dict(state, model)
    if report.family != "pape_hub":
        _logger.info(report.summary())
    return out


def _num_heads(model: nn.Module) -> int | None:
    """Attention heads of a ViT (pape_hub's, timm's VisionTransformer or Eva), None where it says nothing."""
    blocks = getattr(model, "blocks", None)
    return getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks is not None and len(blocks) else None


def _same_encoding(a: nn.Module, b: nn.Module) -> bool:
    """One kind of encoding with position tensors of the same names and shapes: each tensor means the same in both."""
    shapes = [{k: tuple(v.shape) for k, v in e.state_dict().items()} for e in (a, b)]
    return type(a) is type(b) and shapes[0] == shapes[1]


def transplant(source: dict[str, torch.Tensor] | nn.Module, target: nn.Module) -> Conversion:
    """Load every non-positional weight of ``source`` into ``target`` in place, and say what was copied and what is
    new.

    ``target`` keeps or gets its own encoding's initialised position weights where the source has none of its kind
    (also when it was built on the meta device). The classifier is copied only when the class counts agree. A
    source model with another number of attention heads is refused: its ``qkv`` and ``proj`` weights have the
    target's shapes but split into heads differently, so they would compute something else (a state dict does not
    say its head count: that is the caller's to match).

    Args:
        source: a model (a timm ViT / Eva or a pape_hub model of any encoding) or its state dict.
        target: a pape_hub model of the same width, depth and patch size.

    Example:
        >>> import pape_hub, timm
        >>> source = timm.create_model("vit_t4_rope_mixed", embed_dim=32, depth=2, num_heads=2)
        >>> target = timm.create_model("vit_t4_pape", embed_dim=32, depth=2, num_heads=2, num_classes=5)
        >>> print(pape_hub.transplant(source, target).summary())  # doctest: +ELLIPSIS
        pape_hub checkpoint: ... tensors copied; new (the model's own init) pos_encoding...
    """
    if isinstance(source, nn.Module) and None not in (_num_heads(source), _num_heads(target)) \
            and _num_heads(source) != _num_heads(target):
        raise ValueError(f"transplant does not fit: the source has {_num_heads(source)} attention heads and the "
                         f"target {_num_heads(target)}; blocks.*.attn.qkv and blocks.*.attn.proj hold per-head "
                         "weights whose meaning depends on the head count, so they cannot be copied (build the "
                         "target with the source's num_heads)")
    state = source.state_dict() if isinstance(source, nn.Module) else dict(source)
    if not isinstance(source, nn.Module) or not hasattr(source, "pos_encoding"):
        out, report = convert_state_dict(state, target)
    elif _same_encoding(source.pos_encoding, target.pos_encoding):  # fine-tuning: all is copied
        out, report = dict(state), Conversion("pape_hub", copied=sorted(state))
    else:  # a pape_hub model of another encoding: its position weights are not the target's
        backbone = {k: v for k, v in state.items() if not k.startswith("pos_encoding.")}
        report = Conversion("pape_hub", copied=sorted(backbone), dropped=sorted(set(state) - set(backbone)))
        out = fold_layer_scale(backbone, target, report)
        _registers(out, target, report)
        _add_own_positions(out, target, report)
    own = target.state_dict()
    head = {k: v for k, v in out.items() if k.startswith("head.")}
    if any(k not in own or tuple(v.shape) != tuple(own[k].shape) for k, v in head.items()):
        for key in head:  # another class count (or no head): the target keeps its own
            out.pop(key)
            report.dropped.append(f"{key} (other classes)")
    # checked in full before the target is touched: a refused transplant leaves it as it was
    missing = [k for k in own if k not in out and not k.startswith("head.")]
    unexpected = [k for k in out if k not in own]
    shaped = [f"{k} {tuple(out[k].shape)} (target {tuple(own[k].shape)})" for k in out
              if k in own and tuple(out[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shaped:
        raise ValueError(f"transplant does not fit: missing {missing[:6]}, unexpected {unexpected[:6]}, other shapes "
                         f"{shaped[:3]}; the source must be a ViT of the target's width, depth and patch size (build "
                         "the target to match); the target was left as it was")
    if any(t.is_meta for t in target.parameters()):  # built on the meta device: materialise, initialise, then load
        target.to_empty(device="cpu")
        target.init_weights()
    target.load_state_dict(out, strict=False)
    report.own_init += [k for k in target.state_dict() if k.startswith("head.") and k not in out]
    return report


def build_source(name_with_tag: str, model: nn.Module, **model_kwargs: Any) -> tuple[nn.Module, str]:
    """The source of a converted entry built from the same (cached) files by its own code - timm's - or, for a
    release timm does not list, by :mod:`~pape_hub.models.lookhere_reference`; and who built it, in words.
    ``model_kwargs``: the size arguments the model was built with (none for the published sizes)."""
    source = SOURCES[name_with_tag]
    if source.timm_name is None:
        from huggingface_hub import hf_hub_download

        from .lookhere_reference import LookHereReference

        path = hf_hub_download(source.release_cfg["hf_hub_id"], source.release_cfg["hf_hub_filename"])
        release = torch.load(path, map_location="cpu", weights_only=True)
        return (LookHereReference.from_release(release, num_heads=model.pos_encoding.ctx.num_heads),
                "pape_hub's independent re-implementation of the official LookHere forward "
                "(`pape_hub.models.lookhere_reference`, not the encoding the model uses)")
    import timm

    kwargs = {k: v for k, v in model_kwargs.items() if k in ("embed_dim", "depth", "num_heads", "img_size",
                                                             "num_classes", "mlp_ratio")}
    built = timm.create_model(source.timm_name, pretrained=True, pretrained_cfg_overlay=files_overlay(kwargs),
                              **kwargs)
    return built, f"timm's own `{source.timm_name}` code"


@torch.no_grad()
def compare_with_source(model: nn.Module, name_with_tag: str, **model_kwargs: Any) -> dict[str, Any]:
    """Build the source of a converted entry (:func:`build_source`) and measure the largest logit difference to
    ``model`` on a fixed random batch at the model's size, in float32 and in float64."""
    source, built_by = build_source(name_with_tag, model, **model_kwargs)
    source.eval()
    ours = copy.deepcopy(model).eval()
    size = tuple(ours.patch_embed.img_size)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    out: dict[str, Any] = dict(source=SOURCES[name_with_tag].label, built_by=built_by, input=[2, 3, *size])
    for dtype in (torch.float32, torch.float64):
        a, b = source.to(dtype)(x.to(dtype)), ours.to(dtype)(x.to(dtype))
        out[f"max_abs_diff_{str(dtype).removeprefix('torch.')}"] = float((a - b).abs().max())
    out["max_abs_logit"] = float(a.abs().max())
    return out
