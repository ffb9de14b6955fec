"""transformers models of the pape_hub ViT. They wrap the same core module as the timm models
(:class:`~pape_hub.models.vit.VisionTransformer`, as ``self.vit``), so one checkpoint serves both faces: the
state dict is the timm model's with a ``vit.`` prefix, which transformers adds or strips as it loads, and
timm's loader strips (``pape_hub.models.zoo.checkpoint_filter_fn``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from timm.models import get_pretrained_cfg
from torch import nn
from torch.utils._pytree import TreeSpec, tree_unflatten
from transformers import BitImageProcessor, PreTrainedModel
from transformers.backbone_utils import BackboneMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BackboneOutput, BaseModelOutputWithPooling, ImageClassifierOutput

from ..encodings.base import PositionEncoding
from ..folder import (
    CONFIG,
    IMAGE_PROCESSOR,
    VIDEO_PROCESSOR,
    WEIGHTS,
    WEIGHTS_INDEX,
    DataConfig,
    read_manifest,
    weight_files,
    write_manifest,
)
from ..layers.attention import PositionalBlock
from ..models.free_tokens import FreeTokenTransformer
from ..models.native import NaFlexInput, naflex_input
from ..models.vit import VisionTransformer, init_module
from ..models.weights import check_finite_weights
from .configuration_pape_vit import PapeViTConfig
from .remote_code import write_remote_code

__all__ = ["PapeViTBackbone", "PapeViTForImageClassification", "PapeViTLayer", "PapeViTModel", "PapeViTPreTrainedModel"]

AUTO_MAP = {
    "AutoConfig": "configuration_pape_vit.PapeViTConfig",
    "AutoModel": "modeling_pape_vit.PapeViTModel",
    "AutoModelForImageClassification": "modeling_pape_vit.PapeViTForImageClassification",
    "AutoBackbone": "modeling_pape_vit.PapeViTBackbone",
}
#: the image processor is transformers' own (``convert.image_processor_for``; Bit's: resize the short side and
#: centre-crop, as timm's eval transform): every client loads it, with or without pape_hub, and no custom code runs
#: for it. transformers reads a folder whose config.json has timm's
#: ``pretrained_cfg`` as a timm checkpoint and looks for the processor's type in config.json, so it is named there too
IMAGE_PROCESSOR_TYPE = "BitImageProcessor"


class PapeViTLayer(GradientCheckpointingLayer, PositionalBlock):
    """The core's block under transformers' checkpointing convention: ``gradient_checkpointing_enable(
    gradient_checkpointing_kwargs={"use_reentrant": ...})`` reaches it. Same parameters as the core's block; the
    encoding's state comes flattened (the core's ``run_blocks`` passes each tensor positionally, which reentrant
    checkpointing needs to send gradients back into the state)."""

    def forward(self, x: torch.Tensor, encoding: PositionEncoding, state_spec: TreeSpec,
                output_attentions: bool = False, fused: bool = True, *state_leaves: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        state = tree_unflatten(list(state_leaves), state_spec)
        return PositionalBlock.forward(self, x, encoding, state, output_attentions, fused)


class PapeViTPreTrainedModel(PreTrainedModel):
    """Shared by the image (ViT) and video (ViViT) models; a subclass names its config, core model class, Auto
    classes and input layout."""

    config_class = PapeViTConfig
    core_class: type[VisionTransformer] = VisionTransformer
    auto_map: dict[str, str] = AUTO_MAP
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["PapeViTLayer", "PositionalBlock"]

    def get_input_embeddings(self) -> nn.Module:
        """The patch (video: tubelet) embedding, as transformers' ViT returns its patch embeddings."""
        return self.vit.patch_embed

    def _init_weights(self, module: nn.Module) -> None:
        """The core's own init (:func:`~pape_hub.models.vit.init_module`), so both faces initialise alike, also
        every encoding's parameters and buffers when transformers fills weights a file lacks."""
        init_module(module)

    def _move_missing_keys_from_meta_to_device(self, missing_keys: Any, *args: Any, **kwargs: Any) -> None:
        """transformers would now allocate and initialise every weight the file lacks or holds in another shape;
        here a file that lacks weights of the encoding or backbone is refused first, before memory is spent on a
        model the file does not describe. Only the head may be missing (a backbone loaded for classification, or
        ``ignore_mismatched_sizes`` for other labels)."""
        self._refuse_mismatch(missing_keys, ())
        super()._move_missing_keys_from_meta_to_device(missing_keys, *args, **kwargs)

    def _adjust_missing_and_unexpected_keys(self, loading_info: Any) -> None:
        """transformers would only print a table of missing or extra weights; here they are refused (a classifier's
        head may be left over when it is loaded as a backbone), and so are non-finite weights, by name."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        self._refuse_mismatch(loading_info.missing_keys, loading_info.unexpected_keys)
        check_finite_weights(self.state_dict(), f"the weights file of this {self.config.position_encoding!r} model")

    def _refuse_mismatch(self, missing: Any, unexpected: Any) -> None:
        missing = sorted(k for k in missing if not k.startswith("vit.head."))
        unexpected = sorted(k for k in unexpected if not k.startswith("vit.head."))
        if missing or unexpected:
            raise ValueError(
                f"the weights file does not match this {self.config.position_encoding!r} model "
                f"(hidden size {self.config.hidden_size}, {self.config.num_hidden_layers} layers): "
                f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''} (absent or of other shapes), "
                f"unexpected {unexpected[:6]}"
                f"{' ...' if len(unexpected) > 6 else ''}. Is it a checkpoint of another encoding or size?")

    def _core(self, num_classes: int) -> VisionTransformer:
        """The shared core, initialised by its constructor exactly as the timm face is (so a seed gives both faces
        the same tensors); marked initialised so that ``post_init`` does not draw a second init. Built on the meta
        device (transformers' loading), nothing is marked and ``_init_weights`` initialises what a file lacks."""
        core = self.core_class(**self.config.core_kwargs(num_classes), block_fn=PapeViTLayer)
        if not any(t.is_meta for t in core.parameters()):
            for module in core.modules():
                module._is_hf_initialized = True
        return core

    def _core_input(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """transformers' input layout -> the core model's (the same for images)."""
        return pixel_values

    def _run(self, pixel_values: torch.Tensor, output_hidden_states: bool | None, output_attentions: bool | None,
             interpolate_pos_encoding: bool | None, tokens_in: NaFlexInput | None = None
             ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        """(final normed tokens, hidden states: embeddings + every block, attention probabilities), the last two
        None unless asked for (here or in the config). ``tokens_in``: a per-token batch (:func:`native_tokens`)."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        vit = self.vit
        tokens, pos = vit.embed(None if tokens_in is not None else self._core_input(pixel_values),
                                position_interpolation=interpolate_pos_encoding, tokens_in=tokens_in)
        take = set(range(len(vit.blocks))) if output_hidden_states else None
        last, hidden, attentions = vit.run_blocks(tokens, pos, take=take, output_attentions=output_attentions,
                                                  fused=self.config._attn_implementation != "eager")
        return (vit.norm(last), (tokens, *hidden) if output_hidden_states else None,
                tuple(attentions) if output_attentions else None)

    def _output(self, out: Any, return_dict: bool | None) -> Any:
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    def save_pretrained(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> None:
        """transformers' save (weights in one file or shards), then what makes it the checkpoint folder
        :func:`pape_hub.save_checkpoint` writes: ``auto_map`` for every head (not only this class), the code files so
        the folder loads with ``trust_remote_code=True`` without pape_hub, timm's fields in ``config.json`` so
        ``timm.create_model("local-dir:...")`` / ``"hf-hub:..."`` read the same folder, the processor made from the
        same data config, and the manifest of the files written (the only ones a later save or push touches)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) is False:
            return
        directory = Path(save_directory)
        code = write_remote_code(directory, entries=[v.split(".")[0] for v in self.auto_map.values()])
        path = directory / CONFIG
        config = json.loads(path.read_text())
        config.update(folder_fields(self.auto_map, self.config, self.vit))
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        processor = self._processor()  # None for points and events, which need none
        if processor is not None:
            processor.save_pretrained(directory)
        weights = [p.name for p in weight_files(directory)] + ([WEIGHTS_INDEX] if (directory / WEIGHTS_INDEX).exists()
                                                                and not (directory / WEIGHTS).exists() else [])
        earlier = {name for name in (read_manifest(directory) or set()) if (directory / name).is_file()}
        processor_file = [] if processor is None else [VIDEO_PROCESSOR if self.config.is_video else IMAGE_PROCESSOR]
        write_manifest(directory, earlier | {CONFIG, *processor_file, *code, *weights})

    def _processor(self) -> Any:
        return image_processor_of(self.config)


def folder_fields(auto_map: dict[str, str], config: PapeViTConfig, vit: VisionTransformer) -> dict[str, Any]:
    """What a checkpoint folder's ``config.json`` holds beyond the transformers configuration: ``auto_map`` for
    every head (remote code), the processor's type, and timm's fields (:func:`timm_fields`)."""
    fields: dict[str, Any] = {"auto_map": dict(auto_map)}
    for auto, target in auto_map.items():  # AutoVideoProcessor -> video_processor_type
        if auto.endswith("Processor"):
            fields[f"{auto[4:-9].lower()}_processor_type"] = target.split(".")[-1]
    if not config.is_video and not isinstance(vit, FreeTokenTransformer):  # points and events have no processor
        fields["image_processor_type"] = IMAGE_PROCESSOR_TYPE
    return {**fields, **timm_fields(config, vit)}


def data_config_of(config: PapeViTConfig) -> DataConfig:
    """How the model's inputs are prepared: the crop and resize of the timm ``pretrained_cfg`` the configuration was
    loaded with (a converted source's ``crop_pct``, kept through every save), else the registered architecture's
    (as remote code, where nothing is registered: the whole short side, bicubic); the model's size and
    normalisation."""
    mean, std = config.normalisation()
    loaded = getattr(config, "pretrained_cfg", None)
    registered = get_pretrained_cfg(config.timm_name())
    cfg = loaded if isinstance(loaded, dict) else registered.to_dict() if registered else {}
    crop = {k: cfg.get(k) for k in ("crop_pct", "crop_mode", "interpolation")}
    return DataConfig.from_pretrained_cfg(crop, input_size=(config.num_channels, config.image_size, config.image_size),
                                          mean=mean, std=std)


def image_processor_of(config: PapeViTConfig, data_config: DataConfig | None = None) -> BitImageProcessor:
    """transformers' own ``BitImageProcessor`` made from the checkpoint's :class:`~pape_hub.folder.DataConfig`
    (default: :func:`data_config_of` the configuration): resize the short side to ``size / crop_pct`` with its
    interpolation, centre-crop, rescale to [0, 1], normalise - timm's eval transform step by step, so
    ``pipeline(...)`` and timm score the same pixels. Being transformers' own class, it loads from a folder or a Hub
    id in any process, with or without pape_hub, and runs no custom code."""
    return BitImageProcessor(**(data_config or data_config_of(config)).processor_kwargs())


def timm_fields(config: PapeViTConfig, vit: VisionTransformer) -> dict[str, Any]:
    """What timm's Hub loader reads from config.json: architecture, model_args, pretrained_cfg, labels."""
    num_classes = vit.num_classes
    args = config.core_kwargs(num_classes)
    architecture = config.timm_name()
    if isinstance(vit, FreeTokenTransformer):
        return free_token_timm_fields(config, vit, args)
    args["img_size"] = list(vit.patch_embed.img_size)
    if config.is_video:
        args["num_frames"] = vit.patch_embed.num_frames
    pretrained_cfg = dict(
        architecture=architecture, num_classes=num_classes, **data_config_of(config).timm_fields(),
        first_conv="patch_embed.proj", classifier="head", fixed_input_size=False,
    )
    fields = dict(architecture=architecture, model_args=args, num_classes=num_classes, pretrained_cfg=pretrained_cfg,
                  num_features=vit.num_features, global_pool=vit.global_pool)
    labels = {int(k): v for k, v in (config.id2label or {}).items()}  # keys may be "0" (transformers' examples)
    if num_classes and sorted(labels) == list(range(num_classes)):
        fields["label_names"] = [labels[i] for i in range(num_classes)]
    return fields


def free_token_timm_fields(config: PapeViTConfig, vit: FreeTokenTransformer, args: dict[str, Any]
                           ) -> dict[str, Any]:
    """timm's fields of a point or event model: no pixel statistics, no input size beyond the registered one."""
    from timm.models import get_pretrained_cfg

    architecture, num_classes = config.timm_name(), vit.num_classes
    registered = get_pretrained_cfg(architecture)
    cfg = registered.to_dict() if registered else {}
    pretrained_cfg = dict(architecture=architecture, num_classes=num_classes, classifier="head",
                          fixed_input_size=False, **{k: cfg[k] for k in ("input_size", "first_conv") if k in cfg})
    fields = dict(architecture=architecture, model_args=args, num_classes=num_classes, pretrained_cfg=pretrained_cfg,
                  num_features=vit.num_features, global_pool=vit.global_pool)
    labels = {int(k): v for k, v in (config.id2label or {}).items()}
    if num_classes and sorted(labels) == list(range(num_classes)):
        fields["label_names"] = [labels[i] for i in range(num_classes)]
    return fields


def native_tokens(pixel_values: torch.Tensor, pixel_attention_mask: torch.Tensor | None = None,
                  spatial_shapes: torch.Tensor | None = None, patch_coord: torch.Tensor | None = None,
                  ) -> NaFlexInput | None:
    """A per-token batch in transformers' SigLIP2 conventions, or None for images (B, C, H, W): ``pixel_values``
    as patches [B, N, P*P*C] (flattened channels-last, as SigLIP2's processor writes them), ``pixel_attention_mask``
    [B, N] (1 for a real patch) and ``spatial_shapes`` [B, 2] as (h, w) in patches (each image's tokens row-major,
    padding after), or explicit ``patch_coord`` [B, N, 2] as (y, x)."""
    if pixel_values.ndim != 3:
        if pixel_attention_mask is not None or spatial_shapes is not None or patch_coord is not None:
            raise ValueError("pixel_attention_mask / spatial_shapes / patch_coord describe patch sequences: pass "
                             f"pixel_values as patches [B, N, P*P*C], got shape {tuple(pixel_values.shape)}")
        return None
    B, N = pixel_values.shape[:2]
    valid = pixel_attention_mask.bool() if pixel_attention_mask is not None else None
    if patch_coord is None:
        if spatial_shapes is None:
            raise ValueError("patches need their positions: pass spatial_shapes [B, 2] (SigLIP2's) or patch_coord "
                             "[B, N, 2] as (y, x)")
        index = torch.arange(N, device=pixel_values.device)[None]  # (1, N): row-major within each image
        width = spatial_shapes[:, 1:2].clamp(min=1)  # (B, 1)
        patch_coord = torch.stack([index // width, index % width], dim=-1)  # (B, N, 2) as (y, x)
        inside = index < (spatial_shapes[:, 0:1] * spatial_shapes[:, 1:2])
        valid = inside if valid is None else valid & inside
        patch_coord = patch_coord.masked_fill(~valid[..., None], 0)
    return naflex_input(pixel_values, patch_coord, valid)


class PapeViTModel(PapeViTPreTrainedModel):
    """The backbone: final tokens (``last_hidden_state``) and the pooled, normed summary (``pooler_output``)."""

    def __init__(self, config: PapeViTConfig) -> None:
        super().__init__(config)
        self.vit = self._core(num_classes=0)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        pixel_attention_mask: torch.Tensor | None = None,
        spatial_shapes: torch.Tensor | None = None,
        patch_coord: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling | tuple:
        """``pixel_values`` (B, C, H, W), or patches [B, N, P*P*C] with SigLIP2's ``pixel_attention_mask`` and
        ``spatial_shapes`` (or ``patch_coord``): native resolution, every encoding (:func:`native_tokens`)."""
        tokens_in = native_tokens(pixel_values, pixel_attention_mask, spatial_shapes, patch_coord)
        last, hidden, attentions = self._run(pixel_values, output_hidden_states, output_attentions,
                                             interpolate_pos_encoding, tokens_in)
        pooled = self.vit.forward_head(last, pre_logits=True, patch_valid=tokens_in.valid if tokens_in else None)
        return self._output(BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled,
                                                       hidden_states=hidden, attentions=attentions), return_dict)


class PapeViTForImageClassification(PapeViTPreTrainedModel):
    """Backbone + linear head (``config.num_labels`` classes); the loss follows ``config.problem_type``."""

    def __init__(self, config: PapeViTConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = self._core(num_classes=config.num_labels)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        return_dict: bool | None = None,
        pixel_attention_mask: torch.Tensor | None = None,
        spatial_shapes: torch.Tensor | None = None,
        patch_coord: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple:
        """``pixel_values`` (B, C, H, W), or patches [B, N, P*P*C] with SigLIP2's ``pixel_attention_mask`` and
        ``spatial_shapes`` (or ``patch_coord``): native resolution, every encoding (:func:`native_tokens`)."""
        tokens_in = native_tokens(pixel_values, pixel_attention_mask, spatial_shapes, patch_coord)
        last, hidden, attentions = self._run(pixel_values, output_hidden_states, output_attentions,
                                             interpolate_pos_encoding, tokens_in)
        logits = self.vit.forward_head(last, patch_valid=tokens_in.valid if tokens_in else None)
        # the loss's own arguments go through (Trainer's num_items_in_batch: sum / items, not the batch mean, so that
        # gradient accumulation and several processes log and step as one large batch would)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return self._output(ImageClassifierOutput(loss=loss, logits=logits, hidden_states=hidden,
                                                  attentions=attentions), return_dict)


class PapeViTBackbone(BackboneMixin, PapeViTPreTrainedModel):
    """The core as a dense-task backbone (``AutoBackbone``; UperNet, DPT, Mask2Former heads take it through
    ``backbone_config``): feature maps of the stages ``config.out_features`` names (``stem`` = the embeddings,
    ``stageK`` = block K), passed through the final LayerNorm (``config.apply_layernorm``) and, with
    ``config.reshape_hidden_states``, as (B, C, H / p, W / p) grids without the prefix tokens - transformers' DINOv2
    and ViTDet backbones' convention. Every stage has ``hidden_size`` channels at the patch stride."""

    def __init__(self, config: PapeViTConfig) -> None:
        super().__init__(config)
        self.vit = self._core(num_classes=0)
        self.num_features = [config.hidden_size] * (config.num_hidden_layers + 1)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BackboneOutput | tuple:
        vit, core_input = self.vit, self._core_input(pixel_values)
        grid = vit.grid_size_for(core_input)
        _, hidden, attentions = self._run(pixel_values, True, output_attentions, None)
        feature_maps = []
        for stage, tokens in zip(self.stage_names, hidden):  # (B, P + N, D) each: embeddings, then every block
            if stage not in self.out_features:
                continue
            tokens = vit.norm(tokens) if self.config.apply_layernorm else tokens
            if self.config.reshape_hidden_states:  # (B, N, D) -> (B, D, *grid)
                tokens = tokens[:, vit.num_prefix_tokens:].unflatten(1, grid).movedim(-1, 1).contiguous()
            feature_maps.append(tokens)
        keep_hidden = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        return self._output(BackboneOutput(feature_maps=tuple(feature_maps),
                                           hidden_states=hidden if keep_hidden else None, attentions=attentions),
                            return_dict)
