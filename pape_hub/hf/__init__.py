"""The transformers face: ``import pape_hub`` registers these with the Auto classes once transformers is imported.

Images: ``AutoConfig`` (``model_type="pape_vit"``), ``AutoModel``, ``AutoModelForImageClassification``,
``AutoBackbone`` (feature maps for dense-task heads), ``AutoImageProcessor``. Video: ``AutoConfig``
(``model_type="pape_vivit"``), ``AutoModel``, ``AutoModelForVideoClassification``, ``AutoVideoProcessor``.
:mod:`.convert` moves checkpoints between the timm and transformers faces.
"""

from transformers import (
    AutoBackbone,
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForVideoClassification,
    AutoVideoProcessor,
)

from .configuration_pape_vit import PapeViTConfig
from .configuration_pape_vivit import PapeViViTConfig
from .convert import (
    image_processor_for,
    native_processor_for,
    processor_for,
    timm_to_transformers,
    transformers_to_timm,
    video_processor_for,
)
from .image_processing_pape_vit import PapeViTImageProcessor
from .modeling_pape_vit import PapeViTBackbone, PapeViTForImageClassification, PapeViTModel, PapeViTPreTrainedModel
from .modeling_pape_vivit import PapeViViTForVideoClassification, PapeViViTModel, PapeViViTPreTrainedModel
from .video_processing_pape_vivit import PapeViViTVideoProcessor

AutoConfig.register(PapeViTConfig.model_type, PapeViTConfig, exist_ok=True)
AutoModel.register(PapeViTConfig, PapeViTModel, exist_ok=True)
AutoModelForImageClassification.register(PapeViTConfig, PapeViTForImageClassification, exist_ok=True)
AutoBackbone.register(PapeViTConfig, PapeViTBackbone, exist_ok=True)
AutoImageProcessor.register(PapeViTConfig, image_processor_classes={"torchvision": PapeViTImageProcessor},
                            exist_ok=True)
AutoConfig.register(PapeViViTConfig.model_type, PapeViViTConfig, exist_ok=True)
AutoModel.register(PapeViViTConfig, PapeViViTModel, exist_ok=True)
AutoModelForVideoClassification.register(PapeViViTConfig, PapeViViTForVideoClassification, exist_ok=True)
AutoVideoProcessor.register(PapeViViTConfig, PapeViViTVideoProcessor, exist_ok=True)

__all__ = [
    "PapeViTBackbone", "PapeViTConfig", "PapeViTForImageClassification", "PapeViTImageProcessor", "PapeViTModel",
    "PapeViTPreTrainedModel", "PapeViViTConfig", "PapeViViTForVideoClassification", "PapeViViTModel",
    "PapeViViTPreTrainedModel", "PapeViViTVideoProcessor", "image_processor_for", "native_processor_for",
    "processor_for", "timm_to_transformers", "transformers_to_timm", "video_processor_for",
]
