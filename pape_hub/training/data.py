"""The data of a training run: the splits (read once), their transforms, the normalisation, and the loaders."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from timm.data import create_transform
from timm.models import get_pretrained_cfg
from torch.utils.data import DataLoader
from torchvision import transforms

from ..data import (
    ArrowConfig,
    DataBundle,
    EventConfig,
    MotionConfig,
    ShapeConfig,
    VideoTransform,
    build_data,
    channel_statistics,
    check_splits,
    free_token_family,
    generated_task,
    is_video_spec,
)
from ..data.point_clouds import pad_collate
from ..models import model_args_for
from .native import NativeInput, check_native_settings, native_loaders
from .settings import TrainConfig

__all__ = ["TrainingData", "data_transforms", "fixed_normalisation", "input_spec", "prepare_data", "task_setting"]

def task_setting(cfg: TrainConfig) -> Any:
    """The generated task's setting (``ArrowConfig`` / ``MotionConfig`` from ``cfg.arrow`` / ``cfg.motion``), or
    None for a dataset read from files."""
    task = generated_task(cfg.dataset)
    return None if task is None else task.config_class(**getattr(cfg, task.setting_field))


def input_spec(cfg: TrainConfig, generated: Any) -> tuple[int, int | None, bool]:
    """(image size, frames per clip or None, is video), checked against the model; ``generated``: the generated
    task's setting, or None."""
    defaults = {**model_args_for(cfg.model), **cfg.model_kwargs}
    video = "num_frames" in defaults
    if video != is_video_spec(cfg.dataset):
        raise ValueError(f"{cfg.model} is {'a video' if video else 'an image'} model but {cfg.dataset!r} is "
                         f"{'a video' if is_video_spec(cfg.dataset) else 'an image'} dataset")
    img_size = generated.image_size if generated else (cfg.img_size or defaults["img_size"])
    if generated and cfg.img_size not in (None, img_size):
        raise ValueError(f"--img-size {cfg.img_size} does not match the {cfg.dataset} images ({img_size}px)")
    num_frames = None
    if video:
        num_frames = generated.frames if generated else (cfg.num_frames or defaults["num_frames"])
        if generated and list(defaults["tubelet_size"])[0] != generated.tubelet_frames:
            raise ValueError(f"the motion task keeps frames still within tubelets of {generated.tubelet_frames}, but "
                             f"the model's tubelet is {list(defaults['tubelet_size'])}; make them agree")
    return img_size, num_frames, video


def data_transforms(cfg: TrainConfig, img_size: int, channels: int, mean: Any, std: Any, crop_pct: float,
                    video: bool = False, interpolation: str = "bicubic") -> tuple[Any, Any]:
    """(train, eval) transforms of an image or video dataset: the augmentation preset, then normalisation. Clips
    take the preset's random-resized crop and flip, the same for every frame (RandAugment, jitter, Mixup and
    CutMix are image-only)."""
    aug = cfg.augmentation()
    if video:
        if aug["crop_padding"]:
            raise ValueError("crop_padding (--crop-padding) is an image augmentation; clips take --crop-scale")
        return (VideoTransform(img_size, mean, std, crop_scale=aug["crop_scale"], hflip=aug["hflip"]),
                VideoTransform(img_size, mean, std))
    eval_tf = create_transform(img_size, is_training=False, mean=mean, std=std, interpolation=interpolation,
                               crop_pct=crop_pct)
    if aug["crop_scale"] is None and not aug["crop_padding"] and not aug["hflip"] and not aug["color_jitter"] \
            and not aug["randaugment"]:
        return eval_tf, eval_tf
    train_tf = create_transform(img_size, is_training=True, scale=aug["crop_scale"] or (1.0, 1.0),
                                hflip=aug["hflip"], color_jitter=aug["color_jitter"],
                                auto_augment=aug["randaugment"] or None, mean=mean, std=std,
                                interpolation=interpolation, separate=bool(aug["crop_padding"]))
    if aug["crop_padding"]:  # the CIFAR crop: pad, then a random crop of the image size (timm has no such stage)
        _, colour, final = train_tf
        crop = transforms.Compose([
            transforms.Resize(img_size, interpolation=transforms.InterpolationMode(interpolation)),
            transforms.CenterCrop(img_size), transforms.RandomCrop(img_size, padding=aug["crop_padding"]),
            transforms.RandomHorizontalFlip(aug["hflip"])])
        train_tf = transforms.Compose([crop, colour, final])
    return train_tf, eval_tf


def fixed_normalisation(cfg: TrainConfig, channels: int, setting: Any) -> tuple[list[float], list[float]] | None:
    """Mean and std (one per channel) that need no reading of the data: the model's (``normalize="model"``), or a
    generated task's (``setting``: :func:`task_setting`), measured once on a fixed sample of that setting; None
    for a dataset read from files, which is normalised with its training split's own statistics."""
    if cfg.normalize == "model":
        pretrained = get_pretrained_cfg(cfg.model).to_dict()
        mean, std = list(pretrained["mean"]), list(pretrained["std"])
        if channels == 1:  # a grey model: the average of the model's per-channel values
            mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
        return mean, std
    if setting is not None:
        mean, std = generated_task(cfg.dataset).statistics(setting)
        return [round(mean, 6)] * channels, [round(std, 6)] * channels
    return None


@dataclass
class TrainingData:
    """What a run trains and is scored on."""

    data: DataBundle
    train_loader: Any  # a DataLoader, or NaFlexBatches at native resolution (on the device already)
    val_loader: Any
    test_loader: Any
    img_size: int | None  # None for point clouds and event streams
    num_frames: int | None  # frames per clip (video), else None
    data_config: dict[str, Any]  # input_size, mean and std, as the checkpoints record them (points, events: {})


def prepare_data(cfg: TrainConfig, process: tuple[torch.device, int, int] | None = None) -> TrainingData:
    """The splits of ``cfg.dataset`` (read once: a dataset read from files gives its statistics from the same
    splits), transformed and normalised, checked to be readable, and their loaders. ``process``: (device, rank,
    number of processes), which native-resolution batches need (they are this process's share on its device)."""
    arrow_cfg, motion_cfg = ArrowConfig(**cfg.arrow), MotionConfig(**cfg.motion)  # checked whatever the dataset
    if free_token_family(cfg.dataset) is not None:
        return free_token_data(cfg)
    setting = task_setting(cfg)
    img_size, num_frames, video = input_spec(cfg, setting)
    check_native_input(cfg, setting, video)
    channels = cfg.model_kwargs.get("in_chans", 3)
    model_cfg = get_pretrained_cfg(cfg.model)  # how the model's inputs are cropped and resized, as timm's eval does
    crop_pct, interpolation = model_cfg.crop_pct, model_cfg.interpolation or "bicubic"
    read = partial(build_data, cfg.dataset, img_size=img_size, seed=cfg.seed, val_fraction=cfg.val_fraction,
                   train_size=cfg.train_size, eval_size=cfg.eval_size, arrow_config=arrow_cfg,
                   image_column=cfg.image_column, label_column=cfg.label_column, channels=channels,
                   motion_config=motion_cfg, num_frames=num_frames or 16)
    native_files = cfg.native_resolution and setting is None  # PIL images, which timm's NaFlex transforms take

    def split_transforms(mean: Any, std: Any) -> tuple[Any, Any]:
        """(train, eval) transforms; none for files at native resolution (timm's NaFlex loader transforms them)."""
        return (None, None) if native_files else data_transforms(cfg, img_size, channels, mean, std, crop_pct, video,
                                                                 interpolation)

    normalisation = fixed_normalisation(cfg, channels, setting)
    if normalisation is None:  # the training split's own statistics: read unnormalised, then transformed
        zeros, ones = (0.0,) * channels, (1.0,) * channels
        plain = VideoTransform(img_size, zeros, ones) if video else create_transform(
            img_size, is_training=False, mean=zeros, std=ones, interpolation=interpolation, crop_pct=crop_pct)
        raw = read(train_transform=plain, eval_transform=plain)
        mean, std = channel_statistics(raw.train, max_samples=256 if video else 2048)  # decoding clips is slow
        data = raw.with_transforms(*split_transforms(mean, std))
    else:
        mean, std = normalisation
        train_tf, eval_tf = split_transforms(mean, std)
        data = read(train_transform=train_tf, eval_transform=eval_tf, normalize=(mean, std))
    check_splits(data)  # a broken file is named now, not after an epoch of training
    if len(data.val) == 0:  # every epoch would "score" 0.0 from nothing and best/ would freeze at epoch 1
        raise ValueError(f"the validation split of {cfg.dataset} is empty ({len(data.train)} training images in "
                         f"{len(data.classes)} classes; a class needs at least 2 images for one to be held out): add "
                         "images, or a validation/ folder beside train/, so that the best epoch is chosen on real "
                         "scores")
    data_config = dict(input_size=(channels, img_size, img_size), mean=mean, std=std, crop_pct=crop_pct,
                       interpolation=interpolation)
    if cfg.native_resolution:
        spec = native_input(cfg, setting, img_size, mean, std, interpolation)
        loaders = native_loaders(cfg, data.train, data.val, data.test, spec, len(data.classes),
                                 *(process or (torch.device("cpu"), 0, 1)))
        return TrainingData(data, *loaders, img_size, num_frames, data_config)
    return TrainingData(data, *split_loaders(cfg, data), img_size, num_frames, data_config)


def split_loaders(cfg: TrainConfig, data: DataBundle, collate_fn: Any = None) -> tuple[Any, Any, Any]:
    """(train, validation, test or None) loaders of the splits, in batches of ``cfg.batch_size``."""
    generator = torch.Generator().manual_seed(cfg.seed)
    # the last partial batch is dropped only where it is at most 10% of the split (a small folder keeps every image)
    drop_last = len(data.train) % cfg.batch_size <= 0.1 * len(data.train)
    loader = partial(DataLoader, batch_size=cfg.batch_size, num_workers=cfg.num_workers, collate_fn=collate_fn)
    train_loader = loader(data.train, shuffle=True, drop_last=drop_last, generator=generator)
    if len(train_loader) == 0:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one batch of {cfg.batch_size}")
    return train_loader, loader(data.val), loader(data.test) if data.test is not None else None


def free_token_data(cfg: TrainConfig) -> TrainingData:
    """The splits and loaders of point clouds or event streams (``shapes3d``, ``modelnet:PATH``, ``movingdot``,
    ``eventfolder:PATH``): samples of different lengths batched with a validity mask (:func:`pad_collate`)."""
    family = free_token_family(cfg.dataset)
    what = "point clouds" if family == "pointvit" else "event streams"
    if not cfg.model.startswith(f"{family}_"):
        raise ValueError(f"{cfg.dataset!r} holds {what}: train a {family}_* model (e.g. {family}_m_pape; every name: "
                         f"pape_hub.list_pape_models({family!r})), got {cfg.model!r}")
    for name, value, default in (("native_resolution", cfg.native_resolution, False), ("img_size", cfg.img_size, None),
                                 ("num_frames", cfg.num_frames, None)):
        if value != default:
            raise ValueError(f"--{name.replace('_', '-')} is about images or clips; {what} take none")
    channels = {**model_args_for(cfg.model), **cfg.model_kwargs}.get("in_chans", 3 if family == "pointvit" else 4)
    data = build_data(cfg.dataset, img_size=0, seed=cfg.seed, val_fraction=cfg.val_fraction,
                      train_size=cfg.train_size, eval_size=cfg.eval_size, shapes_config=ShapeConfig(**cfg.shapes),
                      event_config=EventConfig(**cfg.events), num_points=cfg.num_points, channels=channels)
    for split in (data.val, data.test, data.train):  # a broken file is named now, not after an epoch
        if split is not None and len(split):
            split[0]
    if len(data.val) == 0:
        raise ValueError(f"the validation split of {cfg.dataset} is empty: add samples, or a validation/ folder")
    return TrainingData(data, *split_loaders(cfg, data, pad_collate), None, None, {})


def check_native_input(cfg: TrainConfig, setting: Any, video: bool) -> None:
    """Native resolution is for images; a generated mix of shapes needs it (its images differ in size)."""
    if cfg.native_resolution:
        if video:
            raise ValueError(f"--native-resolution batches images as token sequences; {cfg.dataset!r} is video (train "
                             "ViViT at a fixed clip size)")
        check_native_settings(cfg, natural_images=setting is None)
    elif getattr(setting, "varying_shape", False):
        raise ValueError(f"--arrow-shapes {setting.shapes} draws images of different sizes, which batch only as "
                         "token sequences: add --native-resolution")


def native_input(cfg: TrainConfig, setting: Any, img_size: int, mean: Any, std: Any, interpolation: str
                 ) -> NativeInput:
    """The model's patch and token count, and for a generated task its largest image's token count (its images
    must be whole patches: they are never resized)."""
    patch = {**model_args_for(cfg.model), **cfg.model_kwargs}.get("patch_size", 16)
    patch = patch if isinstance(patch, int) else patch[0]
    largest = None
    if setting is not None:
        sides = setting.image_shapes
        if any(side % patch for pair in sides for side in pair):
            raise ValueError(f"native resolution keeps generated images at their size, so their sides must be whole "
                             f"{patch}-px patches; {cfg.dataset} images are {sides} px: make --arrow-cell a multiple "
                             f"of {patch}, or the patch size a divisor of it")
        largest = max(h * w for h, w in sides) // (patch * patch)
    return NativeInput(patch, (img_size // patch) ** 2, tuple(mean), tuple(std), interpolation, largest)
