"""The transformers face: ``import pape_hub`` registers these with the Auto classes once transformers is imported.

Images: ``AutoConfig`` (``model_type="pape_vit"``), ``AutoModel``, ``AutoModelForImageClassification``,
``AutoBackbone`` (feature maps for dense-task heads), ``AutoImageProcessor``. Video: ``AutoConfig``
(``model_type="pape_vivit"``), ``AutoModel``, ``AutoModelForVideoClassification``, ``AutoVideoProcessor``. Point clouds
and event streams: ``AutoConfig`` (``pape_pointvit``, ``pape_eventvit``), ``AutoModel`` and
``AutoModelForSequenceClassification`` (a cloud or stream is a set of elements classified as a whole).
:mod:`.convert` moves checkpoints between the timm and transformers faces.
"""

from transformers import (
    AutoBackbone,
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoModelForVideoClassification,
    AutoVideoProcessor,
)

from .configuration_pape_free_tokens import PapeEventViTConfig, PapePointViTConfig
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
from .modeling_pape_free_tokens import (
    PapeEventViTForClassification,
    PapeEventViTModel,
    PapePointViTForClassification,
    PapePointViTModel,
)
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
for _config, _model, _head in ((PapePointViTConfig, PapePointViTModel, PapePointViTForClassification),
                               (PapeEventViTConfig, PapeEventViTModel, PapeEventViTForClassification)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForSequenceClassification.register(_config, _head, exist_ok=True)

__all__ = [
    "PapeEventViTConfig", "PapeEventViTForClassification", "PapeEventViTModel", "PapePointViTConfig",
    "PapePointViTForClassification", "PapePointViTModel", "PapeViTBackbone", "PapeViTConfig",
    "PapeViTForImageClassification", "PapeViTImageProcessor", "PapeViTModel", "PapeViTPreTrainedModel",
    "PapeViViTConfig", "PapeViViTForVideoClassification", "PapeViViTModel", "PapeViViTPreTrainedModel",
    "PapeViViTVideoProcessor", "image_processor_for", "native_processor_for", "processor_for", "timm_to_transformers",
    "transformers_to_timm", "video_processor_for",
]
