"""Native-resolution batches (``pape-hub train --native-resolution``): timm's NaFlex machinery turns each image
into a sequence of its own patches at its own aspect ratio, and pads a batch of them to one length.

Training batches come from timm's ``NaFlexMapDatasetWrapper``: each batch draws a sequence length from
``seq_lens`` and holds about ``batch_size x max(seq_lens)`` tokens, as ``train.py --naflex-loader`` batches.
Validation and test batches are timm's evaluation path: ``ResizeToSequence`` to the longest sequence length,
patchified, collated by ``NaFlexCollator``. A batch is timm's dict (``patches`` ``[B, N, P*P*C]``,
``patch_coord`` ``[B, N, 2]`` as (y, x), ``patch_valid`` ``[B, N]``), which pape_hub's models take as NaFlexViT
takes it.

A generated task is already normalised tensors at native size (the arrow task's ``--arrow-shapes`` mix); those
are patchified as they are, never resized (a resize would change the cell size the task is defined by), and
padded to the largest image's token count.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from timm.data import create_transform
from timm.data.naflex_dataset import NaFlexCollator, NaFlexMapDatasetWrapper
from timm.data.naflex_mixup import NaFlexMixup
from timm.data.naflex_transforms import Patchify
from torch.utils.data import DataLoader, Dataset

from .settings import TrainConfig

__all__ = ["NaFlexBatches", "NativeInput", "check_native_settings", "mixup_for", "native_loaders"]


@dataclass(frozen=True)
class NativeInput:
    """What the NaFlex pipeline needs from the run: the model's patch, the normalisation, the eval resize."""

    patch_size: int
    native_tokens: int  # tokens of the model's own (square) grid: the default sequence length of a file dataset
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    generated_tokens: int | None = None  # a generated task: the largest image's token count, else None


class NaFlexBatches:
    """A NaFlex loader as the training loop iterates it: each batch's tensors moved to ``device``, and
    ``set_epoch`` passed to timm's wrapper (which reshuffles from ``seed + epoch``), as accelerate's loaders do."""

    def __init__(self, loader: DataLoader, device: torch.device, wrapper: NaFlexMapDatasetWrapper | None = None):
        self.loader, self.device, self.wrapper = loader, device, wrapper

    def set_epoch(self, epoch: int) -> None:
        if self.wrapper is not None:
            self.wrapper.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], torch.Tensor]]:
        for inputs, labels in self.loader:
            yield ({k: v.to(self.device) if torch.is_tensor(v) else v for k, v in inputs.items()},
                   labels.to(self.device))


def check_native_settings(cfg: TrainConfig, natural_images: bool) -> None:
    """Refuse, by name, what native-resolution training does not do."""
    if natural_images and cfg.augmentation()["crop_padding"]:
        raise ValueError("--crop-padding pads a fixed-size image; native resolution keeps each image's own size: "
                         "drop --crop-padding (--crop-scale gives timm's random-resized crop to the sequence length)")


def mixup_for(cfg: TrainConfig, num_classes: int) -> NaFlexMixup | None:
    """timm's Mixup/CutMix of images of different sizes (each pair mixes its shared central region), in the
    loader before patchifying, where ``train.py --naflex-loader`` applies it; None where the preset mixes nothing."""
    aug = cfg.augmentation()
    if not (aug["mixup"] or aug["cutmix"]):
        return None
    return NaFlexMixup(num_classes=num_classes, mixup_alpha=aug["mixup"], cutmix_alpha=aug["cutmix"],
                       label_smoothing=cfg.label_smoothing)


def sequence_lengths(cfg: TrainConfig, spec: NativeInput) -> tuple[int, ...]:
    """The training sequence lengths: ``--seq-lens``, else the model's own token count (a generated task: its
    largest image's, which ``--seq-lens`` must not undercut: the collator would cut tokens off)."""
    if spec.generated_tokens is not None:
        if cfg.seq_lens and max(cfg.seq_lens) < spec.generated_tokens:
            raise ValueError(f"--seq-lens {','.join(map(str, cfg.seq_lens))}: the generated task's largest images have "
                             f"{spec.generated_tokens} tokens, and generated images are never resized; pass at least "
                             f"{spec.generated_tokens}, or leave --seq-lens out")
        return (spec.generated_tokens,)
    return cfg.seq_lens or (spec.native_tokens,)


def native_loaders(cfg: TrainConfig, train: Dataset, val: Dataset, test: Dataset | None, spec: NativeInput,
                   num_classes: int, device: torch.device, rank: int = 0, world_size: int = 1
                   ) -> tuple[NaFlexBatches, NaFlexBatches, NaFlexBatches | None]:
    """(train, validation, test) batches of ``train``/``val``/``test`` (PIL images of a file dataset, or a
    generated task's tensors), this process's share of each under several processes. Training labels are soft
    (``[B, num_classes]``) where the preset mixes natural images (:func:`mixup_for`)."""
    seq_lens = sequence_lengths(cfg, spec)
    longest = max(seq_lens)
    aug = cfg.augmentation()
    if spec.generated_tokens is None:  # timm's training transform, resized and cropped to each sequence length
        factory: Any = partial(
            create_transform, is_training=True, naflex=True, use_prefetcher=False, mean=spec.mean, std=spec.std,
            interpolation=spec.interpolation, scale=aug["crop_scale"] or (1.0, 1.0), hflip=aug["hflip"],
            color_jitter=aug["color_jitter"], auto_augment=aug["randaugment"] or None)
        eval_transform = create_transform(is_training=False, naflex=True, use_prefetcher=False, mean=spec.mean,
                                          std=spec.std, interpolation=spec.interpolation, patch_size=spec.patch_size,
                                          max_seq_len=longest, patchify=True)
    else:  # tensors at native size: patchified as they are, never resized
        factory, eval_transform = (lambda **_: None), Patchify(spec.patch_size)
    with contextlib.redirect_stdout(io.StringIO()):  # timm prints each schedule it builds; one line a run suffices
        wrapper = NaFlexMapDatasetWrapper(train, patch_size=spec.patch_size, seq_lens=seq_lens,
                                          max_tokens_per_batch=cfg.batch_size * longest, transform_factory=factory,
                                          mixup_fn=None if spec.generated_tokens else mixup_for(cfg, num_classes),
                                          seed=cfg.seed, shuffle=True, distributed=world_size > 1, rank=rank,
                                          world_size=world_size)
    train_batches = NaFlexBatches(DataLoader(wrapper, batch_size=None, num_workers=cfg.num_workers), device, wrapper)

    def evaluation(split: Dataset) -> NaFlexBatches:
        if world_size > 1:  # this process's share, in order (accelerate's gather puts the shares together)
            split = torch.utils.data.Subset(split, range(rank, len(split), world_size))
        return NaFlexBatches(DataLoader(_Transformed(split, eval_transform), batch_size=cfg.batch_size,
                                        num_workers=cfg.num_workers, collate_fn=NaFlexCollator(longest)), device)

    return train_batches, evaluation(val), evaluation(test) if test is not None else None


class _Transformed(Dataset):
    """``split`` with ``transform`` applied to each image (the split's own transform is left as it is)."""

    def __init__(self, split: Dataset, transform: Any) -> None:
        self.split, self.transform = split, transform

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        image, label = self.split[index]
        return self.transform(image), label
