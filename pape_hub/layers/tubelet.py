"""Tubelet embedding (ViViT, Arnab et al. 2021): non-overlapping t x h x w tubelets of a video, each projected to
one token by a 3-D convolution. The video counterpart of timm's ``PatchEmbed``, with the same attributes
(``img_size``, ``patch_size``, ``grid_size``, ``proj``) so the model code is shared."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TubeletEmbed"]


def _pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class TubeletEmbed(nn.Module):
    """(B, C, T, H, W) -> (B, T / t, H / h, W / w, D), channels last like ``PatchEmbed(output_fmt="NHWC")``.

    ``img_size`` and ``num_frames`` are the nominal input (the training grid); any input whose frames and sides are
    multiples of the tubelet runs.
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 16,
                 in_chans: int = 3, embed_dim: int = 768, num_frames: int = 16, tubelet_frames: int = 2,
                 output_fmt: str = "NHWC", strict_img_size: bool = False) -> None:
        super().__init__()
        if output_fmt != "NHWC":
            raise ValueError(f"TubeletEmbed gives channels-last tokens only (output_fmt 'NHWC'), not {output_fmt!r}")
        self.patch_size = _pair(patch_size)
        self.tubelet_frames = int(tubelet_frames)
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=(self.tubelet_frames, *self.patch_size),
                              stride=(self.tubelet_frames, *self.patch_size))
        self.set_input_size(img_size, num_frames)

    @property
    def tubelet_size(self) -> tuple[int, int, int]:
        return (self.tubelet_frames, *self.patch_size)

    def set_input_size(self, img_size: int | tuple[int, int] | None = None, num_frames: int | None = None) -> None:
        if img_size is not None:
            self.img_size = _pair(img_size)
        if num_frames is not None:
            self.num_frames = int(num_frames)
        (h, w), (ph, pw), t = self.img_size, self.patch_size, self.tubelet_frames
        if self.num_frames % t or h % ph or w % pw:
            raise ValueError(f"a {self.num_frames}-frame {h}x{w} video is not whole tubelets of {t}x{ph}x{pw}; use "
                             f"frames divisible by {t} and sides by the patch size")
        self.grid_size = (self.num_frames // t, h // ph, w // pw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 4, 1)  # (B, D, T', H', W') -> (B, T', H', W', D)
