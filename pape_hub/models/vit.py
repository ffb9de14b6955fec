"""Vision Transformer with a pluggable position encoding, registered in timm.

config (constructor args) -> embeddings (patches, CLS, :meth:`add_to_tokens`) -> attention
(:class:`~pape_hub.layers.PositionalAttention`) -> blocks -> pooling -> head. Positions are computed for the
grid each input actually has, so any image size divisible by the patch size runs without changing the model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch
from timm.layers import LayerNorm, LayerScale, PatchEmbed, global_pool_nlc, register_notrace_function, trunc_normal_
from timm.models import checkpoint
from torch import nn
from torch.utils._pytree import tree_flatten

from ..encodings.base import EncodingContext, PositionEncoding, TokenPositions, compute_dtype, grid_positions
from ..encodings.catalog import check_encoding_kwargs, create_encoding
from ..layers.attention import BlockState, PositionalBlock
from .native import NaFlexInput, embed_patches, masked_pool, naflex_input, per_token_positions

__all__ = ["VisionTransformer", "init_module", "init_prefix_token"]

_POOL_TYPES = ("", "token", "avg", "max", "avgmax")


class VisionTransformer(nn.Module):
    """ViT whose position encoding is a constructor argument (any name in ``pape_hub.list_encodings()``).

    Args mirror timm's ``VisionTransformer``; the position-specific ones are:
        position_encoding: encoding name.
        position_encoding_kwargs: constructor arguments of that encoding (e.g. ``{"num_parabolas": 8}``).
        position_interpolation: scale positions by train grid / test grid at other resolutions (PaPE app. B).

    and, for checkpoints of other ViTs (:mod:`pape_hub.models.pretrained`): ``init_values`` (LayerScale, as timm's
    DeiT-III and Eva), ``norm_eps`` (the LayerNorms' epsilon; timm's ViT uses 1e-6, ``nn.LayerNorm`` 1e-5) and
    ``representation_size`` (the original ViT's pre-logits layer, ``Linear(D, R) -> tanh`` before the classifier,
    as LookHere's released models have; timm's ViT had it under the same name), ``swiglu_mlp`` (timm's ``SwiGLU``
    in every block instead of the GELU MLP, as Eva's DINOv3 S+ / H+; see the block). ``reg_tokens``: learned register
    tokens after CLS (Darcet et al. 2024; DINOv3 has 4); like CLS they are prefix tokens, which no encoding
    positions and pooling skips.
    """

    is_video = False  # the one question callers ask instead of probing attributes

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        class_token: bool = True,
        reg_tokens: int = 0,
        position_encoding: str = "ape",
        position_encoding_kwargs: dict[str, Any] | None = None,
        position_interpolation: bool = False,
        fc_norm: bool | None = None,
        init_values: float | None = None,
        norm_eps: float = 1e-6,
        representation_size: int | None = None,
        swiglu_mlp: bool = False,
        dynamic_img_size: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        head_bias_init: float | None = None,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] | None = None,
        embed_layer: Callable[..., nn.Module] = PatchEmbed,
        block_fn: type[PositionalBlock] = PositionalBlock,
    ) -> None:
        super().__init__()
        if global_pool not in _POOL_TYPES:
            raise ValueError(f"global_pool must be one of {_POOL_TYPES}, got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without one")
        sizes = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        patches = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        if any(size % patch for size, patch in zip(sizes, patches)):
            raise ValueError(f"img_size {sizes} is not divisible by patch_size {patch_size}; the model's native grid "
                             "must be whole patches")
        norm_layer = norm_layer or partial(LayerNorm, eps=norm_eps)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.num_features = self.embed_dim = embed_dim
        self.head_hidden_size = representation_size or embed_dim  # what the classifier takes
        if reg_tokens < 0:
            raise ValueError(f"reg_tokens must be >= 0, got {reg_tokens}")
        self.num_reg_tokens = reg_tokens
        self.num_prefix_tokens = (1 if class_token else 0) + reg_tokens  # CLS first, then the registers
        self.has_class_token = class_token
        self.dynamic_img_size = dynamic_img_size
        self.position_interpolation = position_interpolation
        self.grad_checkpointing = False

        # the stem: timm's PatchEmbed for images, TubeletEmbed for video; tokens (B, *grid, D), channels last
        self.patch_embed = embed_layer(
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
            output_fmt="NHWC", strict_img_size=False,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        ctx = EncodingContext(embed_dim, num_heads, depth, tuple(self.patch_embed.grid_size), self.num_prefix_tokens)
        encoding_kwargs = {} if position_encoding_kwargs is None else position_encoding_kwargs
        check_encoding_kwargs(position_encoding, encoding_kwargs)  # a non-dict is refused by name, not by **
        self.pos_encoding: PositionEncoding = create_encoding(position_encoding, ctx, **encoding_kwargs)
        self.pos_drop = nn.Dropout(pos_drop_rate)

        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth decay rule
        self.blocks = nn.ModuleList(
            block_fn(
                embed_dim, num_heads, layer_idx=i, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_norm=qk_norm,
                proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i], init_values=init_values,
                act_layer=act_layer, norm_layer=norm_layer, swiglu_mlp=swiglu_mlp,
            )
            for i in range(depth)
        )
        reduction = self.patch_embed.patch_size[0]
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=reduction) for i in range(depth)]
        use_fc_norm = global_pool in ("avg", "max", "avgmax") if fc_norm is None else fc_norm
        self.norm = norm_layer(embed_dim) if not use_fc_norm else nn.Identity()
        self.fc_norm = norm_layer(embed_dim) if use_fc_norm else nn.Identity()
        self.pre_logits = nn.Sequential(OrderedDict(fc=nn.Linear(embed_dim, representation_size), act=nn.Tanh())) \
            if representation_size else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.head_hidden_size, num_classes) if num_classes > 0 else nn.Identity()
        self.head_bias_init = head_bias_init
        self.init_weights()

    # --- init ------------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Initialise every parameter and buffer: :func:`init_module` on every module, children first. The
        constructor calls it, and so can a user after building on the meta device and ``to_empty`` (timm's
        ``init_weights``); the transformers face's ``_init_weights`` is the same function, so both faces initialise
        alike."""
        self.apply(init_module)

    def init_self(self) -> None:
        """This module's own tensors: CLS and registers (:func:`init_prefix_token`), and the head rule below."""
        self._init_prefix_tokens()
        self._init_head()

    def _init_prefix_tokens(self) -> None:
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                init_prefix_token(token)

    def _init_head(self) -> None:
        """With ``head_bias_init`` (PaPE's recipe: zero head weights, bias -log(num_classes)) the head starts at
        uniform class probabilities."""
        if self.head_bias_init is not None and isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.constant_(self.head.bias, self.head_bias_init)

    # --- timm model interface --------------------------------------------------------------------
    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        names = {"cls_token"} | ({"reg_token"} if self.reg_token is not None else set())
        return names | {f"pos_encoding.{n}" for n in self.pos_encoding.no_weight_decay()}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return dict(
            stem=r"^cls_token|^reg_token|^pos_encoding|^patch_embed",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @property
    def gradient_checkpointing(self) -> bool:
        """transformers' name for :attr:`grad_checkpointing` (its ``gradient_checkpointing_enable`` sets it)."""
        return self.grad_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enable: bool) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in _POOL_TYPES or (global_pool == "token" and self.cls_token is None):
                raise ValueError(f"unsupported global_pool {global_pool!r} for this model")
            self.global_pool = global_pool
        like = self.patch_embed.proj.weight  # the new head lives where the model does, in its dtype
        self.head = nn.Linear(self.head_hidden_size, num_classes, device=like.device, dtype=like.dtype) \
            if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    def get_patch_size(self) -> tuple[int, ...]:
        """The patch size, as NaFlex-capable timm models give it (timm's ``train.py --naflex-loader`` asks)."""
        return tuple(self.patch_embed.patch_size)

    @property
    def embeds(self) -> nn.Module:
        """The stem under NaFlexViT's name: timm's scripts read ``model.embeds.patch_size`` to patchify for
        ``--naflex-loader``."""
        return self.patch_embed

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: int | None = None) -> None:
        """Change the nominal input size (the grid position interpolation refers to; APE's table size)."""
        if patch_size is not None:
            raise NotImplementedError("changing the patch size is not supported; create a model with that patch size")
        if img_size is None:
            return
        old_grid = tuple(self.patch_embed.grid_size)
        self.patch_embed.set_input_size(img_size=img_size)
        self.pos_encoding.set_grid_size(tuple(self.patch_embed.grid_size), old_grid)

    # --- forward ---------------------------------------------------------------------------------
    def input_spec(self, position_interpolation: bool | None = None) -> InputSpec:
        """Everything an input's grid and positions depend on besides its shape."""
        interpolate = self.position_interpolation if position_interpolation is None else position_interpolation
        return InputSpec(
            channels=self.patch_embed.proj.in_channels, patch=tuple(self.tile_size()),
            native=self.native_size(), train_grid=tuple(self.patch_embed.grid_size), dynamic=self.dynamic_img_size,
            num_prefix_tokens=self.num_prefix_tokens, interpolate=bool(interpolate), axis_units=self.axis_units(),
        )

    def tile_size(self) -> tuple[int, ...]:
        """The input extent of one token: (h, w) patches; the video model's (t, h, w) tubelets."""
        return tuple(self.patch_embed.patch_size)

    def native_size(self) -> tuple[int, ...]:
        """The nominal input size, (H, W); the video model's (T, H, W)."""
        return tuple(self.patch_embed.img_size)

    def grid_size_for(self, x: torch.Tensor) -> tuple[int, ...]:
        """Validate an input batch and return its token grid ((H / p, W / p) for images)."""
        return checked_grid(tuple(x.shape), self.input_spec())

    def axis_units(self) -> tuple[float, ...] | None:
        """Length of one grid step per axis, in grid order (None: one patch each). The video model sets time's."""
        return None

    def positions(self, grid_size: tuple[int, ...], device: torch.device,
                  position_interpolation: bool | None = None) -> TokenPositions:
        """Token positions of a grid; ``position_interpolation`` overrides the model's setting for this call."""
        return spec_positions(grid_size, device, self.input_spec(position_interpolation))

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the stem takes it (the video model accepts two layouts)."""
        return x

    def embed(self, x: torch.Tensor | dict, position_interpolation: bool | None = None,
              tokens_in: NaFlexInput | None = None) -> tuple[torch.Tensor, TokenPositions]:
        """Input (B, C, H, W) or (B, C, T, H, W), or per-token patches (``tokens_in``, :mod:`.native`) -> tokens
        (B, P+N, D) with absolute encodings added, and their positions."""
        if tokens_in is not None:
            tokens, pos = self.embed_tokens(tokens_in, position_interpolation)
        else:
            x = self.prepare_input(x)
            pos = input_positions(x, self.input_spec(position_interpolation))  # validates the input first
            tokens = self.patch_embed(x).flatten(1, -2)  # (B, *grid, D) -> (B, N, D), row-major
        return self.with_prefix_and_positions(tokens, pos), pos

    def with_prefix_and_positions(self, tokens: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
        """Patch tokens (B, N, D) -> (B, P+N, D): CLS and registers first, absolute encodings added, dropout."""
        prefix = [t.expand(tokens.shape[0], -1, -1).to(tokens.dtype) for t in (self.cls_token, self.reg_token)
                  if t is not None]
        if prefix:  # (B, P + N, D): CLS, registers, patches
            tokens = torch.cat([*prefix, tokens], dim=1)
        if "tokens" in self.pos_encoding.mechanisms:
            tokens = encoding_add_to_tokens(self.pos_encoding, tokens, pos)
        return self.pos_drop(tokens)

    def embed_tokens(self, tokens_in: NaFlexInput, position_interpolation: bool | None = None
                     ) -> tuple[torch.Tensor, TokenPositions]:
        """Per-token patches -> patch tokens (B, N, D) and each token's own positions."""
        if self.is_video:
            raise ValueError("per-token inputs (patch_coord) are images: a video model takes clips (B, C, T, H, W)")
        if position_interpolation if position_interpolation is not None else self.position_interpolation:
            raise ValueError("position_interpolation rescales a grid shared by the batch; per-token inputs carry "
                             "their own coordinates: scale patch_coord instead, or turn interpolation off")
        if tokens_in.segments is not None and self.num_prefix_tokens:
            raise ValueError("a packed row gives each image its own output by pooling its own tokens; a model with "
                             f"{self.num_prefix_tokens} prefix token(s) (CLS, registers) would share them between the "
                             "images: build it with class_token=False, global_pool='avg' (reg_tokens=0)")
        tokens = self.patch_embed.norm(embed_patches(self.patch_embed.proj, tokens_in.patches))
        pos = per_token_positions(tokens_in, self.num_prefix_tokens, compute_dtype(tokens))
        return tokens, pos

    def run_blocks(
        self,
        x: torch.Tensor,
        pos: TokenPositions,
        take: set[int] | None = None,
        output_attentions: bool = False,
        stop_after: int | None = None,
        fused: bool = True,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Run the blocks; returns the last tokens, the tokens after each block in ``take`` and attentions.
        ``fused=False`` computes attention eagerly (transformers' ``attn_implementation="eager"``)."""
        state = BlockState(encoding_prepare(self.pos_encoding, pos), positions_mask(pos))
        hidden, attentions = [], []
        blocks = self.blocks if stop_after is None else self.blocks[: stop_after + 1]
        # blocks that checkpoint themselves (transformers' GradientCheckpointingLayer): their reentrant mode treats
        # only positional tensors as inputs, so the encoding's state (tensors every layer shares, with gradients
        # into the encoding's parameters) travels flattened, one positional leaf each; flattened once per forward
        own_checkpointing = getattr(next(iter(self.blocks), None), "gradient_checkpointing", None) is not None
        leaves, spec = tree_flatten(state) if own_checkpointing else ([], None)
        for i, block in enumerate(blocks):
            if own_checkpointing:
                x, probs = block(x, self.pos_encoding, spec, output_attentions, fused, *leaves)
            elif self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                x, probs = checkpoint(block, x, self.pos_encoding, state, output_attentions, fused)
            else:
                x, probs = block(x, self.pos_encoding, state, output_attentions, fused)
            if take is not None and i in take:
                hidden.append(x)
            if probs is not None:
                attentions.append(probs)
        return x, hidden, attentions

    def forward_features(self, x: torch.Tensor | dict, position_interpolation: bool | None = None,
                         patch_coord: torch.Tensor | None = None, patch_valid: torch.Tensor | None = None,
                         segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed tokens (B, P+N, D); ``position_interpolation`` overrides the model's setting for this call.
        Per-token inputs as NaFlexViT's (:func:`~pape_hub.models.native.naflex_input`): patches with
        ``patch_coord``, or the collator's dict; padded tokens come out too, to be dropped by ``patch_valid``."""
        x, pos = self.embed(x, position_interpolation, naflex_input(x, patch_coord, patch_valid, segment_ids))
        x, _, _ = self.run_blocks(x, pos)
        return self.norm(x)

    def pool(self, x: torch.Tensor, pool_type: str | None = None, patch_valid: torch.Tensor | None = None,
             segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """timm's pooling; over valid tokens only where ``patch_valid`` marks padding, per image of a packed row
        (``segment_ids``: (B, S, D))."""
        pool_type = self.global_pool if pool_type is None else pool_type
        if patch_valid is None and segment_ids is None:
            return global_pool_nlc(x, pool_type=pool_type, num_prefix_tokens=self.num_prefix_tokens)
        return masked_pool(x, pool_type, self.num_prefix_tokens, patch_valid, segment_ids)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, patch_valid: torch.Tensor | None = None,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Pool, norm, the pre-logits layer if any, dropout, classifier; ``pre_logits=True`` stops before the
        classifier (timm's convention). ``patch_valid`` / ``segment_ids``: pool as :meth:`pool` says."""
        x = self.pre_logits(self.fc_norm(self.pool(x, patch_valid=patch_valid, segment_ids=segment_ids)))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor | dict, patch_coord: torch.Tensor | None = None,
                patch_valid: torch.Tensor | None = None, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of an image batch (B, C, H, W), or as NaFlexViT's forward: patches [B, N, P*P*C] with
        ``patch_coord`` [B, N, 2] (y, x) and ``patch_valid`` [B, N], or the NaFlex collator's dict. A packed row
        (``segment_ids``) gives (B, S, classes), one row per image. torch.fx traces the image path (the per-token
        arguments stay unused graph inputs)."""
        if is_fx_tracing() or (patch_coord is None and patch_valid is None and segment_ids is None
                               and not isinstance(x, dict)):
            return self.forward_head(self.forward_features(x))
        tokens_in = naflex_input(x, patch_coord, patch_valid, segment_ids)
        x, pos = self.embed(None, tokens_in=tokens_in)
        x, _, _ = self.run_blocks(x, pos)
        return self.forward_head(self.norm(x), patch_valid=tokens_in.valid, segment_ids=tokens_in.segments)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        patch_coord: torch.Tensor | None = None,
        patch_valid: torch.Tensor | None = None,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's feature API: the tokens after the blocks in ``indices``: channels-first maps (``"NCHW"``; for video
        ``"NCHW"`` or ``"NCTHW"`` give (B, C, T, H, W)) or ``"NLC"`` tokens. Per-token inputs (NaFlex patches with
        ``patch_coord``, or the collator's dict) give ``"NLC"`` only, as NaFlexViT's: each sample has its own grid,
        and padding belongs to none (drop it with ``patch_valid``, or scatter by ``patch_coord``)."""
        maps = ("NCHW", "NCTHW") if len(self.patch_embed.grid_size) == 3 else ("NCHW",)
        if output_fmt not in (*maps, "NLC"):
            raise ValueError(f"output_fmt must be one of {(*maps, 'NLC')}, got {output_fmt!r}")
        tokens_in = naflex_input(x, patch_coord, patch_valid)
        if tokens_in is not None and output_fmt != "NLC":
            raise ValueError('per-token inputs have no shared grid to reshape to: use output_fmt="NLC"')
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        B = (tokens_in.patches if tokens_in is not None else x).shape[0]
        grid = self.grid_size_for(self.prepare_input(x)) if tokens_in is None else None
        tokens, pos = self.embed(None if tokens_in is not None else x, tokens_in=tokens_in)
        tokens, hidden, _ = self.run_blocks(tokens, pos, take=set(take_indices),
                                            stop_after=max_index if stop_early else None)
        hidden = [self.norm(h) if norm else h for h in hidden]
        prefix = [h[:, : self.num_prefix_tokens] for h in hidden]
        hidden = [h[:, self.num_prefix_tokens :] for h in hidden]
        if output_fmt != "NLC":
            hidden = [h.reshape(B, *grid, -1).movedim(-1, 1).contiguous() for h in hidden]  # (B, D, *grid)
        if return_prefix_tokens:
            hidden = list(zip(hidden, prefix))
        if intermediates_only:
            return hidden
        return self.norm(tokens), hidden

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = self.pre_logits = nn.Identity()
            self.head_hidden_size = self.embed_dim
            self.reset_classifier(0, "")
        return take_indices


def init_prefix_token(token: torch.Tensor) -> torch.Tensor:
    """CLS and register tokens start near zero, N(0, 1e-6), as timm's ViT starts them."""
    return nn.init.normal_(token, std=1e-6)


@torch.no_grad()
def init_module(module: nn.Module) -> None:
    """The one init of every module of a pape_hub model (applied children first, so a model's own rule comes
    last): timm's ViT init for linears (truncated normal, std 0.02, zero bias), the layer's own default for
    convolutions, norms and LayerScale, ``reset_parameters`` for encodings, CLS and head rules for the model."""
    if isinstance(module, PositionEncoding):
        module.reset_parameters()
    elif isinstance(module, VisionTransformer):
        module.init_self()
    elif isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.Conv2d, nn.Conv3d, nn.LayerNorm, LayerScale)):
        module.reset_parameters()


class InputSpec(NamedTuple):
    """What the grid and positions of an input depend on besides its shape: plain values, so that torch.fx can
    keep them in a graph (timm's FX feature extraction) while the shape-dependent work runs as opaque calls."""

    channels: int
    patch: tuple[int, ...]  # the input extent of one token: (h, w) or (t, h, w)
    native: tuple[int, ...]  # the nominal input size: (H, W) or (T, H, W)
    train_grid: tuple[int, ...]  # the grid position interpolation refers to
    dynamic: bool  # other sizes than `native` accepted
    num_prefix_tokens: int
    interpolate: bool
    axis_units: tuple[float, ...] | None  # grid step per axis in patches (video: time's)


def checked_grid(shape: tuple[int, ...], spec: InputSpec) -> tuple[int, ...]:
    """The token grid of an input of ``shape`` (B, C, *extent), or one error naming what is wrong."""
    video = len(spec.patch) == 3
    if len(shape) != 2 + len(spec.patch) or shape[1] != spec.channels:
        if video:
            raise ValueError(f"expected a video batch (B, {spec.channels}, T, H, W), got shape {shape}")
        if len(shape) != 4:
            raise ValueError(f"expected an image batch (B, C, H, W), got shape {shape}")
        raise ValueError(f"expected {spec.channels} input channels, got {shape[1]} (input shape {shape})")
    extent = shape[2:]
    if any(n % t for n, t in zip(extent, spec.patch)):
        if video:
            (t, ph, pw), (frames, h, w) = spec.patch, extent
            raise ValueError(
                f"a {frames}-frame {h}x{w} clip is not whole tubelets of {t}x{ph}x{pw}; use frames divisible by {t} "
                f"and sides divisible by the patch size (e.g. {max(t, frames // t * t)} frames of "
                f"{h // ph * ph or ph}x{w // pw * pw or pw})")
        (ph, pw), (h, w) = spec.patch, extent
        raise ValueError(f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}; use a multiple of it "
                         f"(e.g. {h // ph * ph or ph}x{w // pw * pw or pw})")
    if not spec.dynamic and tuple(extent) != tuple(spec.native):
        size = "x".join(map(str, extent))
        raise ValueError(f"input size {size} differs from the model's {tuple(spec.native)} and dynamic_img_size=False; "
                         "pass dynamic_img_size=True or call set_input_size()")
    return tuple(n // t for n, t in zip(extent, spec.patch))


def spec_positions(grid_size: tuple[int, ...], device: torch.device, spec: InputSpec,
                   dtype: torch.dtype = torch.float32) -> TokenPositions:
    return grid_positions(grid_size, spec.num_prefix_tokens, spec.train_grid, spec.interpolate, device, dtype,
                          axis_units=spec.axis_units)


# Shape- and state-dependent steps run as opaque calls under torch.fx (timm's feature extraction); everything
# else in the model traces.
@register_notrace_function
def input_positions(x: torch.Tensor, spec: InputSpec) -> TokenPositions:
    """Validate an input and return the positions of its tokens: float64 for a float64 input (a float64 model
    computes positions in float64 throughout), else float32."""
    return spec_positions(checked_grid(tuple(x.shape), spec), x.device, spec, compute_dtype(x))


@register_notrace_function
def encoding_add_to_tokens(encoding: PositionEncoding, tokens: torch.Tensor, pos: TokenPositions) -> torch.Tensor:
    return encoding.add_to_tokens(tokens, pos)


@register_notrace_function
def encoding_prepare(encoding: PositionEncoding, pos: TokenPositions) -> Any:
    return encoding.prepare(pos)


@register_notrace_function
def positions_mask(pos: TokenPositions) -> torch.Tensor | None:
    """Which keys each query may attend (padding, packed rows), or None: every token sees every token."""
    return pos.attention_mask()


def is_fx_tracing() -> bool:
    """True while torch.fx traces the model (timm's FX feature extraction)."""
    return torch.fx._symbolic_trace.is_fx_symbolic_tracing()


def feature_take_indices(num_blocks: int, indices: int | list[int] | None = None) -> tuple[list[int], int]:
    """timm's rule for ``forward_intermediates(indices=)``: None = every block, an int n = the last n, a list =
    those blocks (negative from the end). Returns (absolute indices, the largest). Written here because timm keeps
    its own helper private, and the remote-code copy of this file may rely on timm's public API only."""
    if indices is None:
        indices = num_blocks
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise ValueError(f"last-n ({indices}) is out of range (1 to {num_blocks})")
        take = [num_blocks - indices + i for i in range(indices)]
    else:
        take = [num_blocks + i if i < 0 else i for i in indices]
        if not all(0 <= i < num_blocks for i in take):
            raise ValueError(f"feature indices {list(indices)} are out of range (0 to {num_blocks - 1})")
    return take, max(take)
