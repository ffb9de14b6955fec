"""transformers configuration of the pape_hub ViT: ViT's field names plus the position encoding."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig


class PapeViTConfig(PreTrainedConfig):
    r"""
    Configuration of :class:`PapeViTModel` / :class:`PapeViTForImageClassification`.

    ViT's fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``,
    ``image_size``, ``patch_size``, ``num_channels``, ``qkv_bias``, dropouts) plus:

    position_encoding (`str`): a name from ``pape_hub.list_encodings()`` (e.g. ``"pape"``, ``"rope_mixed"``).
    position_encoding_kwargs (`dict`, *optional*): arguments of that encoding (e.g. ``{"num_parabolas": 8}``).
    position_interpolation (`bool`): scale positions by train grid / test grid at other resolutions.
    use_class_token (`bool`) and pooling (`"token"` or `"avg"`): how the image is summarised for the head.
    timm_architecture (`str`, *optional*): the registered timm name this configuration was made from.
    image_mean, image_std: the normalisation the model was trained with (for the image processor and timm).
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
    position_encoding: str = "ape"
    position_encoding_kwargs: dict[str, Any] | None = None
    position_interpolation: bool = False
    timm_architecture: str | None = None
    image_mean: list[float] | tuple[float, ...] = (0.485, 0.456, 0.406)
    image_std: list[float] | tuple[float, ...] = (0.229, 0.224, 0.225)

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
        )

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
                "attn_drop_rate", 0.0), drop_path_rate=kwargs.get("drop_path_rate", 0.0), **extra,
        )
