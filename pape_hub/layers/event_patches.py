"""Event-camera tokens: spiking patches, as the PaPE paper's event models take them.

The sensor is cut into ``patch_size`` x ``patch_size`` pixel cells. Each cell collects its events in time order and
*fires* a token every ``threshold`` events; a last, smaller group fires at its last event. A token's content is the
histogram of its events over the cell's pixels and the two polarities (P x P x 2 counts, divided by ``threshold``),
projected to D; it sits at (x cell, y cell, firing time / ``time_scale``), so one time unit is as long as one patch
step in space when ``time_scale`` is the time a feature takes to cross a patch.

What makes the tokens depend on the event *set* only: the events are put in one canonical order (time, then x, y,
polarity) before they are counted, so any permutation gives the same tokens (identical events are interchangeable).
The raw time stamps are kept: a stream shifted in time gives the same tokens at shifted times, which a relative
encoding does not see. Padding (``valid`` False) never counts. A stream with more than ``max_tokens`` firings keeps
the earliest; each sample's tokens are padded to the batch's longest, with a validity mask.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["EventPatchEmbed", "spiking_patches"]


def canonical_order(events: torch.Tensor) -> torch.Tensor:
    """(n, 4) events (x, y, t, p) sorted by t, then x, y, p: stable sorts from the last key to the first."""
    order = torch.arange(events.shape[0], device=events.device)
    for column in (3, 1, 0, 2):
        order = order[events[order, column].sort(stable=True).indices]
    return events[order]


def spiking_patches(events: torch.Tensor, sensor_size: tuple[int, int], patch_size: int, threshold: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One stream's valid events (n, 4) as (x, y, t, polarity) -> token histograms (M, P*P*2), their cells (M, 2) as
    (x cell, y cell) and firing times (M,), in order of firing time (ties: by cell)."""
    height, width = sensor_size
    events = canonical_order(events)
    x, y, t = events[:, 0].long(), events[:, 1].long(), events[:, 2]
    cells_x = width // patch_size
    cell = (y // patch_size) * cells_x + x // patch_size  # (n,)
    by_cell = cell.sort(stable=True).indices  # time order kept within a cell
    cell_sorted = cell[by_cell]
    first = torch.searchsorted(cell_sorted, cell_sorted)  # (n,) where each event's cell starts
    rank = torch.arange(cell_sorted.shape[0], device=events.device) - first  # position within its cell
    spike = rank // threshold
    key = cell_sorted * (cell_sorted.shape[0] + 1) + spike  # one key per (cell, firing)
    keys, token = torch.unique_consecutive(key, return_inverse=True)  # tokens in (cell, firing) order
    fire_time = torch.full((keys.shape[0],), -torch.inf, dtype=t.dtype, device=t.device)
    fire_time = fire_time.scatter_reduce(0, token, t[by_cell], reduce="amax")  # the event that completes it
    pixel = ((y % patch_size) * patch_size + x % patch_size)[by_cell] * 2 + (events[by_cell, 3] > 0).long()
    histogram = torch.zeros(keys.shape[0], 2 * patch_size**2, dtype=t.dtype, device=t.device)
    histogram.index_put_((token, pixel), torch.ones_like(t), accumulate=True)
    token_cell = keys // (cell_sorted.shape[0] + 1)
    cells = torch.stack([token_cell % cells_x, token_cell // cells_x], dim=-1)  # (M, 2) as (x, y)
    order = torch.arange(keys.shape[0], device=t.device)[fire_time.sort(stable=True).indices]  # firing order
    return histogram[order] / threshold, cells[order], fire_time[order]


class EventPatchEmbed(nn.Module):
    """Events (B, N, 4) as (x, y, t, polarity) -> tokens (B, M, D), positions (B, M, 3) as (x, y, t) and validity
    (B, M).

    Args:
        sensor_size: (height, width) in pixels; events must lie on it.
        patch_size: P, pixels per cell side.
        threshold: events per firing.
        time_scale: time stamps per position unit.
        max_tokens: the most firings kept per stream (the earliest).
        embed_dim: D.
        nominal_duration: the stream length, in time stamps, the encodings are told of as the grid's time extent.
    """

    def __init__(self, sensor_size: tuple[int, int] | list[int] = (128, 128), patch_size: int = 8,
                 threshold: int = 16, time_scale: float = 1.0, max_tokens: int = 512, embed_dim: int = 384,
                 nominal_duration: float = 16.0) -> None:
        super().__init__()
        height, width = (int(v) for v in sensor_size)
        if height % patch_size or width % patch_size:
            raise ValueError(f"sensor_size {(height, width)} is not divisible by patch_size {patch_size}")
        for name, value in (("threshold", threshold), ("max_tokens", max_tokens), ("time_scale", time_scale),
                            ("nominal_duration", nominal_duration)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.sensor_size, self.threshold, self.max_tokens = (height, width), int(threshold), int(max_tokens)
        self.time_scale = float(time_scale)
        self.patch_size = (patch_size, patch_size, 1)
        steps = max(1, round(nominal_duration / time_scale))
        self.grid_size = (steps, height // patch_size, width // patch_size)  # (t, y, x): grid order
        self.proj = nn.Linear(2 * patch_size**2, embed_dim)
        self.norm = nn.LayerNorm(embed_dim)  # histograms are sparse: tokens of unit scale whatever the threshold

    def forward(self, events: torch.Tensor, valid: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if events.ndim != 3 or events.shape[-1] != 4:
            raise ValueError(f"expected events [B, N, 4] as (x, y, t, polarity), got shape {tuple(events.shape)}")
        B, N, _ = events.shape
        valid = torch.ones(B, N, dtype=torch.bool, device=events.device) if valid is None else valid.bool()
        if tuple(valid.shape) != (B, N):
            raise ValueError(f"valid must be [B, N] = {[B, N]}, got {list(valid.shape)}")
        self.check_on_sensor(events, valid)
        streams = [spiking_patches(events[b][valid[b]].detach(), self.sensor_size, self.patch_size[0],
                                   self.threshold) for b in range(B)]
        length = max(1, max(min(s[0].shape[0], self.max_tokens) for s in streams))
        histograms = events.new_zeros(B, length, self.proj.in_features)
        coords = events.new_zeros(B, length, 3)
        token_valid = torch.zeros(B, length, dtype=torch.bool, device=events.device)
        for b, (histogram, cells, times) in enumerate(streams):
            m = min(histogram.shape[0], self.max_tokens)
            histograms[b, :m] = histogram[:m]
            coords[b, :m] = torch.cat([cells[:m].to(coords.dtype), (times[:m] / self.time_scale)[:, None]], -1)
            token_valid[b, :m] = True
        return self.norm(self.proj(histograms)), coords, token_valid

    def check_on_sensor(self, events: torch.Tensor, valid: torch.Tensor) -> None:
        """Refuse events off the sensor or at non-integer pixels, naming the sensor size to set."""
        xy = events[..., :2][valid]
        height, width = self.sensor_size
        if xy.numel() and (bool((xy != xy.round()).any()) or bool((xy < 0).any()) or bool((xy[:, 0] >= width).any())
                           or bool((xy[:, 1] >= height).any())):
            raise ValueError(f"events must be at whole pixels of the {height}x{width} sensor (x < {width}, "
                             f"y < {height}); got x in [{xy[:, 0].min():g}, {xy[:, 0].max():g}], y in "
                             f"[{xy[:, 1].min():g}, {xy[:, 1].max():g}]: build the model with sensor_size=(H, W) of "
                             "your camera")
