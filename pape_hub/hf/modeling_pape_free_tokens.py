"""transformers models of the point-cloud and event-stream transformers: the image models' machinery (init, loading
checks, checkpointing, saving) around the free-token cores (:class:`~pape_hub.models.pointvit.PointVisionTransformer`,
:class:`~pape_hub.models.eventvit.EventVisionTransformer`, as ``self.vit``).

Inputs: ``points`` [B, N, 3 + C] or ``events`` [B, N, 4] as (x, y, t, polarity), and ``attention_mask`` [B, N] (1 for
a real point or event, 0 for padding), as transformers' sequence models take padding. The classifiers are registered
with ``AutoModelForSequenceClassification``: a cloud or a stream is a set of elements, classified as a whole (the
Auto class transformers has for that; there is none for point clouds or events).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling, SequenceClassifierOutput

from ..models.eventvit import EventVisionTransformer
from ..models.free_tokens import FreeTokenTransformer
from ..models.pointvit import PointVisionTransformer
from .configuration_pape_free_tokens import PapeEventViTConfig, PapeFreeTokenConfig, PapePointViTConfig
from .modeling_pape_vit import PapeViTPreTrainedModel

__all__ = ["PapeEventViTForClassification", "PapeEventViTModel", "PapePointViTForClassification", "PapePointViTModel"]

POINT_AUTO_MAP = {
    "AutoConfig": "configuration_pape_free_tokens.PapePointViTConfig",
    "AutoModel": "modeling_pape_free_tokens.PapePointViTModel",
    "AutoModelForSequenceClassification": "modeling_pape_free_tokens.PapePointViTForClassification",
}
EVENT_AUTO_MAP = {
    "AutoConfig": "configuration_pape_free_tokens.PapeEventViTConfig",
    "AutoModel": "modeling_pape_free_tokens.PapeEventViTModel",
    "AutoModelForSequenceClassification": "modeling_pape_free_tokens.PapeEventViTForClassification",
}


class PapeFreeTokenPreTrainedModel(PapeViTPreTrainedModel):
    """Shared by the point and event models; a subclass names its config, core class, Auto map and input."""

    config_class = PapeFreeTokenConfig
    core_class: type[FreeTokenTransformer] = FreeTokenTransformer
    input_modalities = ()
    _no_split_modules = ["PapeViTLayer", "PositionalBlock"]

    def _processor(self) -> None:
        """No processor: points and events go in as they are (a padded batch and its mask)."""
        return None

    def _run_free(self, x: torch.Tensor, attention_mask: torch.Tensor | None, output_hidden_states: bool | None,
                  output_attentions: bool | None) -> tuple[torch.Tensor, tuple | None, tuple | None, torch.Tensor]:
        """(final normed tokens, hidden states: embeddings + every block, attentions, which tokens are real)."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        vit = self.vit
        tokens, pos = vit.embed_free(x, attention_mask.bool() if attention_mask is not None else None)
        take = set(range(len(vit.blocks))) if output_hidden_states else None
        last, hidden, attentions = vit.run_blocks(tokens, pos, take=take, output_attentions=output_attentions,
                                                  fused=self.config._attn_implementation != "eager")
        return (vit.norm(last), (tokens, *hidden) if output_hidden_states else None,
                tuple(attentions) if output_attentions else None, pos.valid)

    def _backbone(self, x: torch.Tensor, attention_mask: torch.Tensor | None, output_hidden_states: bool | None,
                  output_attentions: bool | None, return_dict: bool | None) -> BaseModelOutputWithPooling | tuple:
        last, hidden, attentions, valid = self._run_free(x, attention_mask, output_hidden_states, output_attentions)
        pooled = self.vit.forward_head(last, pre_logits=True, patch_valid=valid)
        return self._output(BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled,
                                                       hidden_states=hidden, attentions=attentions), return_dict)

    def _classify(self, x: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None,
                  output_hidden_states: bool | None, output_attentions: bool | None, return_dict: bool | None,
                  **kwargs: Any) -> SequenceClassifierOutput | tuple:
        last, hidden, attentions, valid = self._run_free(x, attention_mask, output_hidden_states, output_attentions)
        logits = self.vit.forward_head(last, patch_valid=valid)
        # the loss's own arguments go through (Trainer's num_items_in_batch), as in the image classifier
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return self._output(SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden,
                                                     attentions=attentions), return_dict)


class PapePointViTPreTrainedModel(PapeFreeTokenPreTrainedModel):
    config_class = PapePointViTConfig
    core_class = PointVisionTransformer
    auto_map = POINT_AUTO_MAP
    main_input_name = "points"


class PapePointViTModel(PapePointViTPreTrainedModel):
    """The backbone: final tokens (``last_hidden_state``) and the pooled, normed summary (``pooler_output``)."""

    def __init__(self, config: PapePointViTConfig) -> None:
        super().__init__(config)
        self.vit = self._core(num_classes=0)
        self.post_init()

    def forward(self, points: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, output_attentions: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any) -> BaseModelOutputWithPooling | tuple:
        """``points`` [B, N, 3 + C] (x, y, z first), ``attention_mask`` [B, N] (1: a real point)."""
        return self._backbone(points, attention_mask, output_hidden_states, output_attentions, return_dict)


class PapePointViTForClassification(PapePointViTPreTrainedModel):
    """Backbone + linear head (``config.num_labels`` classes); the loss follows ``config.problem_type``."""

    def __init__(self, config: PapePointViTConfig) -> None:
        super().__init__(config)
        self.loss_type = "ForSequenceClassification"  # transformers finds no loss in this class's name
        self.num_labels = config.num_labels
        self.vit = self._core(num_classes=config.num_labels)
        self.post_init()

    def forward(self, points: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> SequenceClassifierOutput | tuple:
        """``points`` [B, N, 3 + C] (x, y, z first), ``attention_mask`` [B, N] (1: a real point)."""
        return self._classify(points, attention_mask, labels, output_hidden_states, output_attentions, return_dict,
                              **kwargs)


class PapeEventViTPreTrainedModel(PapeFreeTokenPreTrainedModel):
    config_class = PapeEventViTConfig
    core_class = EventVisionTransformer
    auto_map = EVENT_AUTO_MAP
    main_input_name = "events"


class PapeEventViTModel(PapeEventViTPreTrainedModel):
    """The backbone: final tokens (``last_hidden_state``) and the pooled, normed summary (``pooler_output``)."""

    def __init__(self, config: PapeEventViTConfig) -> None:
        super().__init__(config)
        self.vit = self._core(num_classes=0)
        self.post_init()

    def forward(self, events: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, output_attentions: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any) -> BaseModelOutputWithPooling | tuple:
        """``events`` [B, N, 4] as (x, y, t, polarity), ``attention_mask`` [B, N] (1: a real event)."""
        return self._backbone(events, attention_mask, output_hidden_states, output_attentions, return_dict)


class PapeEventViTForClassification(PapeEventViTPreTrainedModel):
    """Backbone + linear head (``config.num_labels`` classes); the loss follows ``config.problem_type``."""

    def __init__(self, config: PapeEventViTConfig) -> None:
        super().__init__(config)
        self.loss_type = "ForSequenceClassification"  # transformers finds no loss in this class's name
        self.num_labels = config.num_labels
        self.vit = self._core(num_classes=config.num_labels)
        self.post_init()

    def forward(self, events: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> SequenceClassifierOutput | tuple:
        """``events`` [B, N, 4] as (x, y, t, polarity), ``attention_mask`` [B, N] (1: a real event)."""
        return self._classify(events, attention_mask, labels, output_hidden_states, output_attentions, return_dict,
                              **kwargs)
