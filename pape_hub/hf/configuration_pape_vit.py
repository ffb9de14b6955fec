"""transformers configuration of the pape_hub ViT: ViT's field names plus the position encoding."""

from __future__ import annotations

import math
from typing import Any

from transformers import PreTrainedConfig

__all__ = ["CONFIG_CLASSES", "PapeViTConfig", "check_config_agreement"]


class PapeViTConfig(PreTrainedConfig):
    r"""
    Configuration of :class:`PapeViTModel` / :class:`PapeViTForImageClassification`.

    ViT's fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
    ``image_size``, ``patch_size``, ``num_channels``, ``qkv_bias``, dropouts) plus:

    position_encoding (`str`): a name from ``pape_hub.list_encodings()`` (e.g. ``"pape"``, ``"rope_mixed"``).
    position_encoding_kwargs (`dict`, *optional*): arguments of that encoding (e.g. ``{"num_parabolas": 8}``).
    position_interpolation (`bool`): scale positions by train grid / test grid at other resolutions.
    use_class_token (`bool`) and pooling (`"token"` or `"avg"`): how the image is summarised for the head.
    use_fc_norm (`bool`, *optional*): norm after pooling instead of before it (default: with average pooling).
    layer_norm_eps (`float`): every LayerNorm's epsilon (1e-6 as timm's ViT; 1e-5 for ``nn.LayerNorm`` sources).
    layerscale_value (`float`, *optional*): LayerScale's initial gain (DeiT-III, Eva); None: no LayerScale.
    timm_architecture (`str`, *optional*): the registered timm name this configuration was made from.
    image_mean, image_std: the normalisation the model was trained with (for the image processor and timm), per
        channel or one number for all.
    """

    model_type = "pape_vit"

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
    pooling: str = "token"
    use_fc_norm: bool | None = None
    layerscale_value: float | None = None
    position_encoding: str = "ape"
    position_encoding_kwargs: dict[str, Any] | None = None
    position_interpolation: bool = False
    timm_architecture: str | None = None
    image_mean: float | list[float] | tuple[float, ...] = (0.485, 0.456, 0.406)
    image_std: float | list[float] | tuple[float, ...] = (0.229, 0.224, 0.225)

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

    def core_kwargs(self, num_classes: int) -> dict[str, Any]:
        """Constructor arguments of the shared core ``VisionTransformer`` (the timm model)."""
        if self.hidden_act != "gelu":
            raise ValueError(f"pape_vit supports hidden_act='gelu' only, got {self.hidden_act!r}")
        return dict(
            img_size=self.image_size, patch_size=self.patch_size, in_chans=self.num_channels, num_classes=num_classes,
            global_pool=self.pooling, embed_dim=self.hidden_size, depth=self.num_hidden_layers,
            num_heads=self.num_attention_heads, mlp_ratio=self.intermediate_size / self.hidden_size,
            qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, class_token=self.use_class_token,
            position_encoding=self.position_encoding, position_encoding_kwargs=self.position_encoding_kwargs or {},
            position_interpolation=self.position_interpolation, proj_drop_rate=self.hidden_dropout_prob,
            attn_drop_rate=self.attention_probs_dropout_prob, drop_path_rate=self.drop_path_rate,
            fc_norm=self.use_fc_norm, init_values=self.layerscale_value, norm_eps=self.layer_norm_eps,
        )

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> PapeViTConfig:
        """transformers' loader; a ``config.json`` whose timm fields describe another model is refused first."""
        check_config_agreement(config_dict, config_class=cls)
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def field_names(cls) -> set[str]:
        return {name for klass in cls.__mro__ for name in getattr(klass, "__annotations__", {})}

    @classmethod
    def from_core_kwargs(cls, kwargs: dict[str, Any], **extra: Any) -> PapeViTConfig:
        """The inverse of :meth:`core_kwargs` (timm model arguments -> configuration)."""
        img = kwargs.get("img_size", 224)
        img = img[0] if isinstance(img, (list, tuple)) else img
        dim = kwargs.get("embed_dim", 768)
        return cls(
            hidden_size=dim, num_hidden_layers=kwargs.get("depth", 12), num_attention_heads=kwargs.get("num_heads", 12),
            intermediate_size=int(dim * kwargs.get("mlp_ratio", 4.0)), image_size=img,
            patch_size=kwargs.get("patch_size", 16), num_channels=kwargs.get("in_chans", 3),
            qkv_bias=kwargs.get("qkv_bias", True), qk_norm=kwargs.get("qk_norm", False),
            use_class_token=kwargs.get("class_token", True), pooling=kwargs.get("global_pool", "token"),
            position_encoding=kwargs.get("position_encoding", "ape"),
            position_encoding_kwargs=kwargs.get("position_encoding_kwargs") or None,
            position_interpolation=kwargs.get("position_interpolation", False),
            hidden_dropout_prob=kwargs.get("proj_drop_rate", 0.0), attention_probs_dropout_prob=kwargs.get(
                "attn_drop_rate", 0.0), drop_path_rate=kwargs.get("drop_path_rate", 0.0),
            use_fc_norm=kwargs.get("fc_norm"), layerscale_value=kwargs.get("init_values"),
            layer_norm_eps=kwargs.get("norm_eps", 1e-6), **extra,
        )


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
