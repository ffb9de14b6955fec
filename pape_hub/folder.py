"""The checkpoint folder's layout: its file names, its manifest, its weights (one file or shards).

Both writers of a checkpoint folder (:func:`pape_hub.save_checkpoint` and the transformers face's
``save_pretrained``) and every reader (the two faces' loaders, push, card, evaluation) name the folder's files through
this module, and only through it. It imports nothing of the package (the transformers face's remote-code copy carries
it), so every layer may use it without an import circle.

The manifest (:data:`MANIFEST`) lists the files pape_hub wrote in the folder: the only files a later save may replace
or remove, and the only files a push sends. A manifest may come from anywhere (a Hub repo fetched with
``snapshot_download``), so it is checked on read: each entry must be a plain file name inside the folder.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONFIG", "DataConfig", "IMAGE_PROCESSOR", "MANIFEST", "VIDEO_PROCESSOR", "WEIGHTS", "WEIGHTS_INDEX",
           "atomic_write", "index_shards", "is_plain_name", "read_manifest", "read_weights", "weight_files",
           "write_manifest"]

WEIGHTS, WEIGHTS_INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
IMAGE_PROCESSOR, VIDEO_PROCESSOR = "preprocessor_config.json", "video_preprocessor_config.json"
#: the hidden list of what pape_hub wrote in a checkpoint folder (the only files a later save may replace or remove)
MANIFEST = ".pape_hub_checkpoint.json"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it onto ``path``. The temporary name is
    ``.NAME.tmp-XXXXXXXX``, which no user file is taken for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are as readable as every other file written here
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def is_plain_name(name: object) -> bool:
    """A file name that stays inside its folder on every system: no separator of any OS, no drive, not ``.``/``..``,
    no control characters."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\:")
            and all(ord(c) >= 32 for c in name))


def read_manifest(directory: Path) -> set[str] | None:
    """The names an earlier save (and the writers after it) listed in ``directory``'s manifest; None without one.

    An entry that is not a plain file name inside the folder (``../x``, ``/x``, ``C:\\x``, ``sub/x``) refuses the
    whole manifest, naming the entry and the fix: a writer removes what the manifest lists, so it is never
    followed."""
    path = Path(directory) / MANIFEST
    if path.is_symlink():
        raise ValueError(f"{path} is a link; pape_hub writes its manifest as a file. Delete it (the folder's other "
                         "files stay) and save again, or save to a new folder")
    try:
        listed = json.loads(path.read_text()).get("files") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(listed, list):
        return None
    bad = [name for name in listed if not is_plain_name(name)]
    if bad:
        raise ValueError(f"{path} lists {bad[0]!r}, which is not a plain file name inside {directory}: the manifest "
                         "was not written by pape_hub (forged or corrupt), and a save removes what it lists. Delete "
                         f"{path.name} (the folder's other files stay) and save again, or save to a new folder")
    return set(listed)


def write_manifest(directory: Path, names: set[str]) -> None:
    """List ``names`` (plain names of files pape_hub wrote in ``directory``) as the folder's manifest."""
    record = dict(written_by="pape_hub.save_checkpoint", files=sorted(set(names) - {MANIFEST}))
    atomic_write(Path(directory) / MANIFEST, lambda p: p.write_text(json.dumps(record, indent=1) + "\n"))


def weight_files(directory: str | Path) -> list[Path]:
    """The folder's safetensors weights: ``model.safetensors``, or every shard its index names (what
    ``save_pretrained(max_shard_size=...)`` and ``push_to_hub`` write for large models). Raises naming what is
    missing; an index naming a path outside the folder is refused."""
    directory = Path(directory)
    if (directory / WEIGHTS).exists():
        return [directory / WEIGHTS]
    index = directory / WEIGHTS_INDEX
    if not index.exists():
        raise FileNotFoundError(f"{directory} has no {WEIGHTS} (nor the {WEIGHTS_INDEX} of a sharded save): not a "
                                "saved model folder, or its weights were not copied")
    return index_shards(index, lambda name: directory / name)


def index_shards(index: Path, locate: Callable[[str], Path]) -> list[Path]:
    """The shard files a safetensors index names (each a plain name beside it), located by ``locate(name)`` (a path
    in the folder, or a download), checked to exist."""
    try:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{index} is corrupt (no weight_map of tensor -> shard file): {err}") from err
    bad = [name for name in names if not is_plain_name(name) or not name.endswith(".safetensors")]
    if bad or not names:
        raise ValueError(f"{index} names {bad[0] if bad else 'no shard'!r}: a shard must be a .safetensors file "
                         "beside the index")
    shards = [locate(name) for name in names]
    missing = [p.name for p in shards if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
    return shards


def read_weights(files: list[Path]) -> dict:
    """Every tensor of the given safetensors files (one, or a sharded save's shards) as one state dict; a tensor
    in two shards is refused."""
    from safetensors.torch import load_file

    state: dict = {}
    for path in files:
        part = load_file(str(path))
        twice = sorted(set(part) & set(state))
        if twice:
            raise ValueError(f"{path} repeats tensors of another shard ({', '.join(twice[:3])}): a corrupt save")
        state.update(part)
    return state


#: the largest input side a checkpoint's data config may ask preprocessing to produce (a 4096 px image is 200 MB
#: as float32; a hostile ``size`` of 20000 would ask for gigabytes per image)
MAX_INPUT_SIDE = 4096
#: timm's interpolation names -> Pillow's resample codes, which transformers' image processors take
PIL_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


@dataclass(frozen=True)
class DataConfig:
    """How a checkpoint's inputs are prepared, the one record both faces' preprocessing derive from: timm's eval
    transform (``timm.data.resolve_data_config`` + ``create_transform``) reads it from ``pretrained_cfg``, and the
    transformers image processor (:meth:`processor_kwargs`) is made from it, so ``pipeline(...)`` and timm score
    the same pixels.

    As timm's eval transform: with ``crop_mode="center"`` the short side is resized to ``floor(size / crop_pct)``
    and the centre ``size`` x ``size`` cropped; ``"squash"`` resizes both sides to ``floor(size / crop_pct)`` (the
    aspect ratio is not kept) and crops the centre. The two agree to resize rounding (at most 2 grey levels with
    transformers' default torchvision backend, none with its PIL backend), except that where the crop's margin is
    odd, transformers rounds the offset down and torchvision (timm) to the nearest even pixel: the crop may then sit
    one pixel apart."""

    input_size: tuple[int, ...]  # (C, H, W)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 1.0
    crop_mode: str = "center"
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        channels = self.input_size[0]
        if not 1 <= channels <= 64 or any(not 1 <= s <= MAX_INPUT_SIDE for s in self.input_size[1:]):
            raise ValueError(f"input_size {list(self.input_size)} is outside [1, {MAX_INPUT_SIDE}] pixels per side "
                             "(or 1 to 64 channels): a corrupt or hostile data config")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) != channels or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ValueError(f"{name} {list(values)} must be {channels} finite numbers, one per input channel")
        if not all(v > 0 for v in self.std):
            raise ValueError(f"std {list(self.std)} must be positive (a zero std divides by zero)")
        if not (isinstance(self.crop_pct, (int, float)) and 0 < self.crop_pct <= 1):
            raise ValueError(f"crop_pct {self.crop_pct!r} must lie in (0, 1]")
        if self.crop_mode not in ("center", "squash"):
            raise ValueError(f"crop_mode {self.crop_mode!r} is not supported; use 'center' or 'squash'")
        if self.interpolation not in PIL_RESAMPLE:
            raise ValueError(f"interpolation {self.interpolation!r} is not one of {sorted(PIL_RESAMPLE)}")

    @classmethod
    def from_pretrained_cfg(cls, cfg: dict, **overrides: object) -> DataConfig:
        """From a timm ``pretrained_cfg`` (dict) and overrides (None values ignored); missing crop settings take
        timm's defaults for a saved folder: the whole short side, bicubic."""
        values = {**{k: cfg.get(k) for k in ("input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation")},
                  **{k: v for k, v in overrides.items() if v is not None}}
        values = {k: v for k, v in values.items() if v is not None}
        for key in ("input_size", "mean", "std"):
            if key not in values:
                raise ValueError(f"a data config needs {key!r}")
            values[key] = tuple(values[key])
        values["input_size"] = tuple(int(v) for v in values["input_size"])
        return cls(**values)

    @property
    def size(self) -> int:
        return self.input_size[-1]

    def timm_fields(self) -> dict:
        """The keys of timm's ``pretrained_cfg`` this record fills."""
        return dict(input_size=list(self.input_size), mean=list(self.mean), std=list(self.std),
                    crop_pct=self.crop_pct, crop_mode=self.crop_mode, interpolation=self.interpolation)

    def resize_size(self) -> int:
        """The short side before the centre crop, as timm computes it (``floor(size / crop_pct)``)."""
        return int(math.floor(self.size / self.crop_pct))

    def processor_kwargs(self) -> dict:
        """Arguments of transformers' ``BitImageProcessor`` (resize the short side, centre-crop, rescale, normalise:
        timm's eval transform step by step)."""
        common = dict(resample=PIL_RESAMPLE[self.interpolation], image_mean=list(self.mean), image_std=list(self.std),
                      do_convert_rgb=self.input_size[0] == 3)
        crop = dict(do_center_crop=True, crop_size={"height": self.input_size[1], "width": self.input_size[2]})
        if self.crop_mode == "squash":  # both sides to 1 / crop_pct of the target, aspect ratio not kept
            height, width = (int(math.floor(s / self.crop_pct)) for s in self.input_size[1:])
            return dict(common, size={"height": height, "width": width}, **crop)
        return dict(common, size={"shortest_edge": self.resize_size()}, **crop)
