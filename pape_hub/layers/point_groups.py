"""Point-cloud tokens (Point-BERT / Point-MAE): local groups of points, each one token at its centre.

Farthest-point sampling picks ``num_groups`` centres, each centre takes its ``group_size`` nearest points, and a
small shared MLP on the points' coordinates relative to their centre (and their features, if any), max-pooled over
the group, makes the token. The token sits at its centre's (x, y, z), times ``coord_scale``.

What makes the tokens depend on the point *set* only, never on the order of the points:

* sampling starts at the point nearest the centroid of the valid points (not index 0), and each later centre is the
  point farthest from those chosen; ties are of measure zero for real coordinates;
* a group is a set (k nearest) and the MLP is max-pooled over it;
* padding (``valid`` False) is never a centre nor a neighbour. A cloud with fewer valid points than centres gives
  ``num_groups`` minus that many invalid tokens; a group with fewer points than ``group_size`` repeats its nearest
  point, which a maximum does not see.

Relative coordinates make the tokens' content translation invariant; a shift of the cloud moves their positions
only, so a relative encoding's logits do not change. With ``rotation_invariant=True`` each point is described by
what a rotation keeps instead of its relative coordinates: its distance to the centre, its distance to the group's
mean, its dot product with that mean, the sizes of its offset from the mean along the group's principal axes (their
signs dropped, which an eigenvector does not fix), and the group's spread along those axes. Sampling and grouping
depend on distances only, so the tokens' content is then rotation invariant too, and a model with a
rotation-invariant encoding (PaPE-RI, ALiBi) and no CLS gives the same logits for a cloud in any pose.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["INVARIANT_FEATURES", "PointGroupEmbed", "farthest_point_sample", "group_nearest", "invariant_description"]


def farthest_point_sample(xyz: torch.Tensor, num: int, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (B, num) of ``num`` centres among the valid points of ``xyz`` (B, N, 3), and which of them are real
    (B, num): a cloud of n < num valid points has n."""
    B, N, _ = xyz.shape
    weights = valid.to(xyz.dtype)
    centroid = (xyz * weights[..., None]).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)  # (B, 3)
    far = torch.finfo(xyz.dtype).max
    to_centroid = ((xyz - centroid[:, None]) ** 2).sum(-1).masked_fill(~valid, far)  # (B, N)
    chosen = [to_centroid.argmin(1)]  # (B,) the start: nearest the centroid, whatever the order
    nearest = torch.full((B, N), far, dtype=xyz.dtype, device=xyz.device).masked_fill(~valid, -1.0)
    rows = torch.arange(B, device=xyz.device)
    for _ in range(num - 1):
        last = xyz[rows, chosen[-1]]  # (B, 3)
        nearest = torch.minimum(nearest, ((xyz - last[:, None]) ** 2).sum(-1).masked_fill(~valid, -1.0))
        chosen.append(nearest.argmax(1))  # padding sits at -1, below any distance
    count = valid.sum(1, keepdim=True)  # (B, 1)
    return torch.stack(chosen, 1), torch.arange(num, device=xyz.device)[None] < count


def group_nearest(xyz: torch.Tensor, centres: torch.Tensor, k: int, valid: torch.Tensor) -> torch.Tensor:
    """Indices (B, G, k) of the ``k`` valid points nearest each centre (B, G, 3); where a cloud has fewer than k valid
    points, the nearest one fills the rest."""
    distance = torch.cdist(centres, xyz).masked_fill(~valid[:, None], torch.inf)  # (B, G, N)
    k_eff = min(k, xyz.shape[1])
    dist, index = distance.topk(k_eff, dim=-1, largest=False)  # (B, G, k_eff), nearest first
    index = torch.where(torch.isinf(dist), index[..., :1], index)  # padding never joins a group
    if k_eff < k:
        index = torch.cat([index, index[..., :1].expand(-1, -1, k - k_eff)], dim=-1)
    return index


def gather_points(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values (B, N, C), index (B, ...) -> (B, ..., C)."""
    flat = index.reshape(index.shape[0], -1)  # (B, M)
    out = values.gather(1, flat[..., None].expand(-1, -1, values.shape[-1]))
    return out.reshape(*index.shape, values.shape[-1])


#: values per point of :func:`invariant_description`
INVARIANT_FEATURES = 9


def invariant_description(relative: torch.Tensor) -> torch.Tensor:
    """Points relative to their group's centre (B, G, k, 3) -> what a rotation of the cloud keeps, (B, G, k, 9): the
    distance to the centre, the distance to the group's mean and the dot product with it, the absolute offset from
    the mean along each principal axis of the group, and the group's standard deviation along each axis."""
    mean = relative.mean(2, keepdim=True)  # (B, G, 1, 3)
    spread = relative - mean
    covariance = spread.transpose(-1, -2) @ spread / spread.shape[2]  # (B, G, 3, 3)
    variances, axes = torch.linalg.eigh(covariance)  # ascending; the axes rotate with the cloud
    along = (spread @ axes).abs()  # (B, G, k, 3): an axis's sign is arbitrary, its size is not
    scale = variances.clamp(min=0).sqrt()[:, :, None].expand_as(along)  # (B, G, k, 3)
    return torch.cat([relative.norm(dim=-1, keepdim=True), spread.norm(dim=-1, keepdim=True),
                      (relative * mean).sum(-1, keepdim=True), along, scale], dim=-1)


class PointGroupEmbed(nn.Module):
    """Points (B, N, 3 + C) -> tokens (B, G, D), their positions (B, G, 3) and validity (B, G).

    Args:
        num_groups: G, tokens per cloud (centres of farthest-point sampling).
        group_size: k, points per group.
        in_chans: per-point values, 3 coordinates first (3: xyz only; 6: xyz and normals).
        embed_dim: D.
        hidden_dim: width of the shared MLP.
        coord_scale: positions are the centres times this; relative coordinates are scaled the same way. A cloud
            normalised to the unit sphere with the default 4 spans about 8 position units, the extent of an 8-patch
            grid, where the encodings' defaults were set.
        rotation_invariant: describe points by distances and a dot product instead of relative coordinates.
    """

    def __init__(self, num_groups: int = 64, group_size: int = 32, in_chans: int = 3, embed_dim: int = 384,
                 hidden_dim: int = 128, coord_scale: float = 4.0, rotation_invariant: bool = False) -> None:
        super().__init__()
        if in_chans < 3:
            raise ValueError(f"points carry x, y, z first: in_chans must be >= 3, got {in_chans}")
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"num_groups and group_size must be >= 1, got {num_groups} and {group_size}")
        if not coord_scale > 0:
            raise ValueError(f"coord_scale must be positive, got {coord_scale}")
        self.num_groups, self.group_size, self.in_chans = num_groups, group_size, in_chans
        self.coord_scale = float(coord_scale)
        self.rotation_invariant = rotation_invariant
        span = round(2 * coord_scale) or 1
        self.grid_size = (span, span, span)  # the nominal extent the encodings are told of, (z, y, x) order
        self.patch_size = (1, 1, 1)
        # Point-MAE's two-stage PointNet: per point, then each point with its group's maximum, then the maximum.
        # LayerNorm where Point-MAE has BatchNorm: per point, so a sample's tokens never depend on the rest of the
        # batch (padding), and the ViT init's small weights still give tokens of unit scale
        described = in_chans + (INVARIANT_FEATURES - 3 if rotation_invariant else 0)  # per point, into the MLP
        self.local = nn.Sequential(nn.Linear(described, hidden_dim), nn.LayerNorm(hidden_dim), nn.GELU(),
                                   nn.Linear(hidden_dim, hidden_dim))
        self.fuse = nn.Sequential(nn.Linear(2 * hidden_dim, hidden_dim), nn.LayerNorm(hidden_dim), nn.GELU())
        self.proj = nn.Linear(hidden_dim, embed_dim)

    def forward(self, points: torch.Tensor, valid: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if points.ndim != 3 or points.shape[-1] != self.in_chans:
            raise ValueError(f"expected points [B, N, {self.in_chans}] (x, y, z first), got shape "
                             f"{tuple(points.shape)}")
        B, N, _ = points.shape
        valid = torch.ones(B, N, dtype=torch.bool, device=points.device) if valid is None else valid.bool()
        if tuple(valid.shape) != (B, N):
            raise ValueError(f"valid must be [B, N] = {[B, N]}, got {list(valid.shape)}")
        xyz = points[..., :3]
        with torch.no_grad():  # which points are centres and neighbours is a choice, not a function to differentiate
            centre_index, token_valid = farthest_point_sample(xyz.detach(), self.num_groups, valid)
            centres = gather_points(xyz.detach(), centre_index)  # (B, G, 3)
            neighbours = group_nearest(xyz.detach(), centres, self.group_size, valid)  # (B, G, k)
        centres = gather_points(xyz, centre_index)  # (B, G, 3), differentiable in the coordinates
        group = gather_points(points, neighbours)  # (B, G, k, 3 + C)
        relative = (group[..., :3] - centres[:, :, None]) * self.coord_scale  # (B, G, k, 3)
        if self.rotation_invariant:
            relative = invariant_description(relative)  # (B, G, k, 3) -> (B, G, k, INVARIANT_FEATURES)
        features = self.local(torch.cat([relative, group[..., 3:]], dim=-1))  # (B, G, k, h)
        summary = features.amax(2, keepdim=True).expand_as(features)  # (B, G, k, h)
        tokens = self.proj(self.fuse(torch.cat([features, summary], dim=-1)).amax(2))  # (B, G, D)
        return tokens, centres * self.coord_scale, token_valid
