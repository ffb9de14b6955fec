"""transformers configuration of the pape_hub ViT: ViT's field names plus the position encoding."""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedConfig
from transformers.backbone_utils import BackboneConfigMixin

__all__ = ["CONFIG_BOUNDS", "CONFIG_CLASSES", "PapeViTConfig", "check_checkpoint_config", "check_config_agreement",
           "config_bound_problems"]


class PapeViTConfig(BackboneConfigMixin, PreTrainedConfig):
    r"""
    Configuration of :class:`PapeViTModel` / :class:`PapeViTForImageClassification`.

    ViT's fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
    ``image_size``, ``patch_size``, ``num_channels``, ``qkv_bias``, dropouts) plus:

    position_encoding (`str`): a name from ``pape_hub.list_encodings()`` (e.g. ``"pape"``, ``"rope_mixed"``).
    position_encoding_kwargs (`dict`, *optional*): arguments of that encoding (e.g. ``{"num_parabolas": 8}``).
    position_interpolation (`bool`): scale positions by train grid / test grid at other resolutions.
    num_register_tokens (`int`): learned register tokens after CLS (DINOv3: 4), unpositioned like CLS.
    use_class_token (`bool`) and pooling (`"token"` or `"avg"`): how the image is summarised for the head.
    use_fc_norm (`bool`, *optional*): norm after pooling instead of before it (default: with average pooling).
    layer_norm_eps (`float`): every LayerNorm's epsilon (1e-6 as timm's ViT; 1e-5 for ``nn.LayerNorm`` sources).
    layerscale_value (`float`, *optional*): LayerScale's initial gain (DeiT-III, Eva); None: no LayerScale.
    representation_size (`int`, *optional*): width of a pre-logits layer (``Linear -> tanh``) before the classifier,
        as the original ViT and LookHere's releases have; None: none.
    use_swiglu_ffn (`bool`): a SwiGLU MLP in every block instead of the GELU one (DINOv3 S+; Dinov2's field name).
    timm_architecture (`str`, *optional*): the registered timm name this configuration was made from.
    image_mean, image_std: the normalisation the model was trained with (for the image processor and timm), per
        channel or one number for all.
    out_features (`list[str]`, *optional*) / out_indices (`list[int]`, *optional*): for ``AutoBackbone``, the
        stages whose feature maps it returns: ``"stem"`` (the embeddings) and ``"stage1"`` ... ``"stageL"`` (the
        blocks), as transformers' ViT-style backbones name them; default the last block.
    apply_layernorm (`bool`): the backbone's feature maps pass the final LayerNorm (DINOv2's convention).
    reshape_hidden_states (`bool`): the backbone's feature maps are (B, C, H, W) grids without the prefix tokens;
        False: (B, tokens, C) as the blocks give them.

    Example:
        >>> import torch
        >>> from pape_hub.hf import PapeViTConfig, PapeViTForImageClassification
        >>> config = PapeViTConfig(position_encoding="rope_mixed", hidden_size=64, num_hidden_layers=2,
        ...                        num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=4,
        ...                        num_labels=10)
        >>> PapeViTForImageClassification(config)(torch.randn(1, 3, 32, 32)).logits.shape
        torch.Size([1, 10])
    """

    model_type = "pape_vit"
    is_video = False  # a class attribute, not a saved field

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    drop_path_rate: float = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-6
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    qkv_bias: bool = True
    qk_norm: bool = False
    use_class_token: bool = True
    num_register_tokens: int = 0
    pooling: str = "token"
    use_fc_norm: bool | None = None
    layerscale_value: float | None = None
    representation_size: int | None = None
    use_swiglu_ffn: bool = False
    position_encoding: str = "ape"
    position_encoding_kwargs: dict[str, Any] | None = None
    position_interpolation: bool = False
    timm_architecture: str | None = None
    image_mean: float | list[float] | tuple[float, ...] = (0.485, 0.456, 0.406)
    image_std: float | list[float] | tuple[float, ...] = (0.229, 0.224, 0.225)
    _out_features: list[str] | None = None
    _out_indices: list[int] | None = None
    apply_layernorm: bool = True
    reshape_hidden_states: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        """The backbone's stage names (``stem``, ``stage1`` ... ``stageL``) and its output stages."""
        self.stage_names = ["stem"] + [f"stage{i}" for i in range(1, self.num_hidden_layers + 1)]
        self.set_output_features_output_indices(out_indices=kwargs.pop("out_indices", None),
                                                out_features=kwargs.pop("out_features", None))
        super().__post_init__(**kwargs)

    def normalisation(self) -> tuple[list[float], list[float]]:
        """(mean, std), one value per channel; a single number (as transformers' image processors accept) is the
        same for every channel."""
        def per_channel(value: Any) -> list[float]:
            return [float(value)] * self.num_channels if isinstance(value, (int, float)) else [float(v) for v in value]

        return per_channel(self.image_mean), per_channel(self.image_std)

    def timm_name(self) -> str:
        """The timm entry point that builds this model. Any registered name of the same encoding does, since
        :meth:`core_kwargs` gives every constructor argument; the recorded one is preferred."""
        return self.timm_architecture or f"vit_t4_{self.position_encoding}"

    #: transformers field -> the core's constructor argument, one row each (both directions are read from it; a
    #: field's default is the class attribute above). ``intermediate_size`` is ``mlp_ratio`` times the width.
    core_fields = (
        ("hidden_size", "embed_dim"), ("num_hidden_layers", "depth"), ("num_attention_heads", "num_heads"),
        ("image_size", "img_size"), ("patch_size", "patch_size"), ("num_channels", "in_chans"),
        ("qkv_bias", "qkv_bias"), ("qk_norm", "qk_norm"), ("use_class_token", "class_token"),
        ("pooling", "global_pool"), ("position_encoding", "position_encoding"),
        ("position_encoding_kwargs", "position_encoding_kwargs"), ("position_interpolation", "position_interpolation"),
        ("hidden_dropout_prob", "proj_drop_rate"), ("attention_probs_dropout_prob", "attn_drop_rate"),
        ("drop_path_rate", "drop_path_rate"), ("use_fc_norm", "fc_norm"), ("layerscale_value", "init_values"),
        ("layer_norm_eps", "norm_eps"), ("representation_size", "representation_size"),
        ("num_register_tokens", "reg_tokens"), ("use_swiglu_ffn", "swiglu_mlp"),
    )

    def core_kwargs(self, num_classes: int) -> dict[str, Any]:
        """Constructor arguments of the shared core ``VisionTransformer`` (the timm model), by :attr:`core_fields`."""
        if self.hidden_act != "gelu":
            raise ValueError(f"pape_vit supports hidden_act='gelu' only, got {self.hidden_act!r}")
        kwargs = {core: getattr(self, field) for field, core in self.core_fields}
        return dict(kwargs, num_classes=num_classes, mlp_ratio=self.intermediate_size / self.hidden_size,
                    position_encoding_kwargs=self.position_encoding_kwargs or {})

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> PapeViTConfig:
        """transformers' loader; a ``config.json`` whose timm fields describe another model is refused first."""
        check_checkpoint_config(config_dict, config_class=cls)
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def field_names(cls) -> set[str]:
        return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}

    @classmethod
    def from_core_kwargs(cls, kwargs: dict[str, Any], **extra: Any) -> PapeViTConfig:
        """The inverse of :meth:`core_kwargs` (timm model arguments -> configuration); an argument left out takes
        the field's default."""
        values = {field: kwargs[core] for field, core in cls.core_fields if core in kwargs}
        if isinstance(values.get("image_size"), (list, tuple)):
            values["image_size"] = values["image_size"][0]  # square inputs: (224, 224) -> 224
        width = values.get("hidden_size", cls.hidden_size)
        values["intermediate_size"] = int(width * kwargs.get("mlp_ratio", cls.intermediate_size / cls.hidden_size))
        values["position_encoding_kwargs"] = values.get("position_encoding_kwargs") or None
        return cls(**values, **extra)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        a = list(a) if isinstance(a, (list, tuple)) else [a, a]  # img_size: 32 == [32, 32]
        b = list(b) if isinstance(b, (list, tuple)) else [b, b]
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    return (a or None) == (b or None) if isinstance(a, dict) or isinstance(b, dict) else a == b


def config_disagreements(config: dict[str, Any], config_class: type[PapeViTConfig] | None = None) -> list[str]:
    """Where a saved ``config.json``'s timm fields (``model_args``, ``architecture``) describe another model than its
    transformers fields. One folder serves both faces, which read different fields; the transformers fields are the
    source of truth and the timm fields are written from them, so any difference is a hand edit or a foreign file."""
    args = config.get("model_args")
    if not isinstance(args, dict) or "position_encoding" not in config:
        return []
    config_class = config_class or CONFIG_CLASSES.get(config.get("model_type"), PapeViTConfig)
    names = config_class.field_names() & set(config)
    expected = config_class(**{k: config[k] for k in names}).core_kwargs(args.get("num_classes", 0))
    problems = [f"model_args.{key} = {args[key]!r}, but the transformers fields give {value!r}"
                for key, value in expected.items() if key in args and key != "num_classes" and not _same(args[key],
                                                                                                          value)]
    architecture = config.get("architecture")
    if architecture and not str(architecture).endswith(f"_{config['position_encoding']}"):
        problems.append(f"architecture = {architecture!r} is not a {config['position_encoding']!r} model")
    return problems


#: what a checkpoint's ``config.json`` may ask for, checked before anything is built from it: field -> (low, high).
#: Far above every model this package describes (ViT-L: 24 layers of 1024; DINOv3 7B: 40 of 4096), far below what
#: would exhaust a machine before the weights file is even compared with it.
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 256), "depth": (1, 256), "hidden_size": (1, 16384), "embed_dim": (1, 16384),
    "num_attention_heads": (1, 1024), "num_heads": (1, 1024), "intermediate_size": (1, 262144),
    "image_size": (1, 16384), "patch_size": (1, 16384), "num_channels": (1, 64), "in_chans": (1, 64),
    "num_register_tokens": (0, 1024), "reg_tokens": (0, 1024), "representation_size": (1, 65536),
    "num_frames": (1, 4096), "num_labels": (0, 131072), "num_classes": (0, 131072), "img_size": (1, 16384),
    # the point and event stems'
    "num_groups": (1, 65536), "group_size": (1, 4096), "group_hidden_dim": (1, 16384), "max_tokens": (1, 1 << 20),
    "threshold": (1, 1 << 30), "event_patch_size": (1, 4096), "sensor_size": (1, 65536),
}
MAX_TOKENS = 2**22  # patch (tubelet) tokens of the nominal input: a 2048^2 grid


def config_bound_problems(config: dict[str, Any]) -> list[str]:
    """Fields of a checkpoint's ``config.json`` (the transformers fields and timm's ``model_args``) outside
    :data:`CONFIG_BOUNDS`, or not integers, and a nominal input of more than :data:`MAX_TOKENS` tokens."""
    problems = []
    args = config.get("model_args") if isinstance(config.get("model_args"), dict) else {}
    labels = config.get("id2label")
    sized = dict(config, **({"num_labels": len(labels)} if isinstance(labels, dict) else {}))
    for where, fields in (("", sized), ("model_args.", args)):
        for name, (low, high) in CONFIG_BOUNDS.items():
            value = fields.get(name)
            values = value if isinstance(value, (list, tuple)) else [value]  # img_size may be (H, W)
            if value is None:
                continue
            if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
                problems.append(f"{where}{name} = {str(value)[:40]} must be an integer")
            elif not all(low <= v <= high for v in values):
                problems.append(f"{where}{name} = {value} is outside [{low}, {high}]")
    size, patch = sized.get("image_size", 224), sized.get("patch_size", 16)
    if not problems and isinstance(size, int) and isinstance(patch, int) and (size // patch) ** 2 > MAX_TOKENS:
        problems.append(f"image_size {size} / patch_size {patch} is a grid of {(size // patch) ** 2:,} tokens "
                        f"(at most {MAX_TOKENS:,})")
    return problems


def check_checkpoint_config(config: dict[str, Any], where: str = "config.json",
                            config_class: type[PapeViTConfig] | None = None) -> None:
    """What every loader runs on a checkpoint's ``config.json`` before building anything from it: its sizes within
    :data:`CONFIG_BOUNDS` (a hostile or corrupt file must not start a build that exhausts the machine), then its two
    faces' fields in agreement (:func:`check_config_agreement`)."""
    problems = config_bound_problems(config)
    if problems:
        raise ValueError(f"{where} asks for a model no checkpoint of pape_hub can be: " + "; ".join(problems)
                         + ". The file is corrupt or not a pape_hub configuration")
    check_config_agreement(config, where, config_class)


def check_config_agreement(config: dict[str, Any], where: str = "config.json",
                           config_class: type[PapeViTConfig] | None = None) -> None:
    """Raise if :func:`config_disagreements` finds any: the two faces would build different models."""
    problems = config_disagreements(config, config_class)
    if problems:
        raise ValueError(f"{where} disagrees with itself, so timm and transformers would build different models: "
                         + "; ".join(problems) + ". Make the fields agree (the transformers fields, e.g. "
                         "position_encoding, are the source of truth) or re-save the model.")


#: model_type -> configuration class (the video configuration adds itself)
CONFIG_CLASSES: dict[str, type[PapeViTConfig]] = {PapeViTConfig.model_type: PapeViTConfig}
