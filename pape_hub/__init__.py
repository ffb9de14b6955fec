"""pape_hub: every modern vision position encoding behind one interface, in timm and transformers ViTs.

``import pape_hub`` registers the models ``vit_{t,s,b,l}16_{encoding}``, ``vit_{t,s}4_{encoding}`` and
``vivit_{t,s,b}16_{encoding}`` in timm and, when transformers is installed (``pip install pape_hub[hf]``), the
``pape_vit`` / ``pape_vivit`` model types with transformers' Auto classes, as soon as transformers is imported (at
once if it already is). The models need torch and timm only.
"""

from importlib import import_module
from importlib import metadata as _metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .encodings import EncodingContext, PositionEncoding, TokenPositions, create_encoding, list_encodings
from .models import (
    PUBLISHED_WEIGHTS,
    VisionTransformer,
    list_pape_models,
    list_pretrained,
    model_args_for,
    register_published_weights,
    transplant,
)
from .models.zoo import SOURCE_CONFIG_CHECKS


def _register_transformers_face() -> None:
    import_module(".hf", __name__)  # registers the configs, models and processors with transformers' Auto classes


def _check_config_agreement(config: dict[str, Any], where: str = "config.json") -> None:
    """timm's ``local-dir:`` / ``hf-hub:`` loads check a folder's ``config.json`` before timm builds from it: sizes
    within bounds, its transformers fields describing the model its timm fields do, and its weights file's tensor
    shapes those of that model (the checks need transformers' config classes, imported on first use)."""
    from .checkpoint import WEIGHTS, check_weights_shapes, warn_interrupted_save
    from .hf.configuration_pape_vit import check_checkpoint_config

    check_checkpoint_config(config, where)
    folder = Path(where).parent
    if "architecture" in config and (folder / WEIGHTS).is_file():  # the weights timm is about to read
        check_weights_shapes(config, folder / WEIGHTS, where)
    warn_interrupted_save(folder)  # a local folder a save was interrupted in: say what loads


if find_spec("transformers") is not None:
    # the transformers face is registered when transformers is imported (at once if it already is), so that
    # `import pape_hub` costs timm users no transformers import (pape_hub.import_hooks)
    from .import_hooks import when_imported

    if _check_config_agreement not in SOURCE_CONFIG_CHECKS:
        SOURCE_CONFIG_CHECKS.append(_check_config_agreement)
    when_imported("transformers", _register_transformers_face,
                  failed="the pape_vit / pape_vivit Auto classes are not registered (the timm models work); "
                  "`import pape_hub.hf` shows the full error, e.g. an unsupported transformers version")

try:  # one place states the version: pyproject.toml, read from the installed metadata
    __version__ = _metadata.version("pape_hub")
except _metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

#: the optional dependencies, by their import name -> the extra that installs them (``pip install 'pape_hub[X]'``)
EXTRAS = {"transformers": "hf", "huggingface_hub": "hf", "safetensors": "hf", "jinja2": "hf", "accelerate": "train",
          "tqdm": "train", "matplotlib": "train", "filelock": "train", "datasets": "data", "sklearn": "data",
          "h5py": "data", "av": "video"}


def missing_extra(err: ImportError) -> str | None:
    """What to say for an optional dependency that is not installed: the extra that installs it, or None when the
    error is about something else."""
    name = (getattr(err, "name", None) or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return None
    return (f"{name} is not installed; it comes with pape_hub's '{extra}' extra: pip install 'pape_hub[{extra}]' "
            f"(from a checkout: pip install -e '.[{extra}]')")


#: names that need an optional extra, imported on first use: name -> (module, extra that installs it)
_LAZY = {
    "load_checkpoint": (".checkpoint", "hf"), "save_checkpoint": (".checkpoint", "hf"),
    "push_checkpoint": (".hub", "hf"), "PapeViTConfig": (".hf", "hf"),
    "PapeViTForImageClassification": (".hf", "hf"), "PapeViTImageProcessor": (".hf", "hf"),
    "PapeViTModel": (".hf", "hf"),
}


def __getattr__(name: str) -> Any:
    if name == "hf":  # the transformers face, before transformers has been imported (which registers it)
        try:
            return import_module(".hf", __name__)
        except ImportError as err:
            raise ImportError(f"pape_hub.hf: {missing_extra(err) or err}") from err
    if name not in _LAZY:
        raise AttributeError(f"module 'pape_hub' has no attribute {name!r}")
    module, extra = _LAZY[name]
    try:
        return getattr(import_module(module, __name__), name)
    except ImportError as err:
        raise ImportError(f"pape_hub.{name} needs the '{extra}' extra: pip install 'pape_hub[{extra}]' (from a "
                          f"checkout: pip install -e '.[{extra}]'); {err}") from err


__all__ = [
    "EXTRAS", "PUBLISHED_WEIGHTS", "EncodingContext", "PapeViTConfig", "PapeViTForImageClassification",
    "PapeViTImageProcessor", "PapeViTModel", "PositionEncoding", "TokenPositions", "VisionTransformer",
    "create_encoding", "list_encodings", "list_pape_models", "list_pretrained", "load_checkpoint", "missing_extra",
    "model_args_for",
    "push_checkpoint", "register_published_weights", "save_checkpoint", "transplant",
]
