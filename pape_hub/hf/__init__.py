"""The transformers face: ``import pape_hub`` registers these with the Auto classes.

``AutoConfig`` (``model_type="pape_vit"``), ``AutoModel``, ``AutoModelForImageClassification`` and
``AutoImageProcessor``. :mod:`.convert` moves checkpoints between the timm and transformers faces.
"""

from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoModelForImageClassification

from .configuration_pape_vit import PapeViTConfig
from .convert import image_processor_for, timm_to_transformers, transformers_to_timm
from .image_processing_pape_vit import PapeViTImageProcessor
from .modeling_pape_vit import PapeViTForImageClassification, PapeViTModel, PapeViTPreTrainedModel

AutoConfig.register(PapeViTConfig.model_type, PapeViTConfig, exist_ok=True)
AutoModel.register(PapeViTConfig, PapeViTModel, exist_ok=True)
AutoModelForImageClassification.register(PapeViTConfig, PapeViTForImageClassification, exist_ok=True)
AutoImageProcessor.register(PapeViTConfig, image_processor_classes={"torchvision": PapeViTImageProcessor},
                            exist_ok=True)

__all__ = [
    "PapeViTConfig", "PapeViTForImageClassification", "PapeViTImageProcessor", "PapeViTModel",
    "PapeViTPreTrainedModel", "image_processor_for", "timm_to_transformers", "transformers_to_timm",
]
