"""SaPE^2 (arXiv 2505.09466): semantic-aware 2-D positions, CoPE-style, as an additive logit bias.

Per layer, head and axis (eqs. 9-16; reference code in the paper's appendix D):

1. gates within each row (x axis) or column (y axis): g_ij = sigmoid(q_i . k_j / sqrt(d));
2. contextual positions: p_im = sum of g_ij over the keys j of the same row at or after column m
   (a reverse cumulative sum), clamped to [0, npos - 1];
3. position logits z_i[p] = u_i . e[p] for integer p (key mode: u = k, the paper's best; query mode: u = q),
   linearly interpolated at the fractional p_im, giving the vector SaPE_x[i] = (z_i1, ..., z_iW);
4. bias_in = ||SaPE_x[i] - SaPE_x[n]||_2 + ||SaPE_y[i] - SaPE_y[n]||_2, added to q.k before the sqrt(d)
   division (eq. 16).

The bias depends on content, so it is a (B, heads, N, N) tensor built every forward (not fused, like the
method itself). npos defaults to the longest training-grid side + 1 (positions lie in [0, W]); larger
grids clamp, as the reference does. The paper's code takes H == W; here rows and columns may differ.
Video (this project's extension; the paper is 2-D): time is a third axis treated like the other two - gates and
contextual positions along each temporal line, its own position-logit table, and a third distance term.
The paper has no class token in this path: CLS gets a zero bias row and column and takes no part in gates.
``sape2_ape`` adds a learned absolute embedding (the paper's SaPE^2 + APE).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
from timm.layers import trunc_normal_
from torch import nn
from torch.autograd.function import once_differentiable

from .absolute import AddsLearnedTable
from .base import (
    BiasRows,
    EncodingContext,
    PositionEncoding,
    TokenPositions,
    cell_counts,
    cell_index,
    differentiated,
    row_blocks,
)
from .registry import register_encoding

__all__ = ["SaPE2", "SaPE2State"]


def line_gates(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Eq. 9's gates sigmoid(q_i . k_j * scale) of lines (..., L, d) of queries and keys: (..., L_i, L_j), one batched
    product over the lines (the lines are copied once where they are not contiguous; torch.matmul copied the keys a
    second time, transposed)."""
    L, d = q.shape[-2:]
    scores = torch.bmm(q.reshape(-1, L, d), k.reshape(-1, L, d).mT)  # (lines, L, L)
    return scores.mul_(scale).sigmoid_().view(*q.shape[:-1], L)


def keys_at_or_after(length: int, like: torch.Tensor) -> torch.Tensor:
    """(L_j, L_m) ones where j >= m: gates (..., L_i, L_j) times it sum, for each m, the gates of the keys at or after
    m (eq. 10) in one matrix product, where a reverse cumulative sum flipped the (..., L, L) gates twice."""
    return torch.ones(length, length, dtype=like.dtype, device=like.device).tril_()


class LineTerms(NamedTuple):
    """The terms of eqs. 9-15 for lines of queries and keys. Eq. 13's interpolation is taken as z[floor] + frac *
    (z[floor + 1] - z[floor]): one gather fewer than z[floor] (1 - frac) + z[ceil] frac, and one pass."""

    gates: torch.Tensor  # (..., L_i, L_j) from :func:`line_gates`, before the ``present`` mask
    positions: torch.Tensor  # p_im = sum_{j >= m} g_ij (masked gates), not yet clamped to npos - 1
    logits: torch.Tensor  # z_i[p] at integer p, (..., L, npos)
    steps: torch.Tensor  # z_i[p + 1] - z_i[p], zero at the last p, (..., L, npos)
    floor: torch.Tensor  # (..., L, L) int64: the integer position at or below the clamped p_im
    frac: torch.Tensor  # clamped p_im - floor

    @classmethod
    def from_products(cls, gates: torch.Tensor, logits: torch.Tensor, present: torch.Tensor | None,
                      in_place: bool = False) -> LineTerms:
        """The terms from the gates and the logits at integer positions (the two matrix products). ``in_place``
        (nothing differentiated): each term is written over the one before, so that ``gates`` holds its masked gates
        and ``positions`` holds ``frac``; only :meth:`interpolated` may follow."""
        if present is not None:
            mask = present[..., None, :].to(gates.dtype)
            gates = gates.mul_(mask) if in_place else gates * mask
        positions = gates @ keys_at_or_after(gates.shape[-1], gates)
        last = logits.shape[-1] - 1
        pos = positions.clamp_(max=last) if in_place else positions.clamp(max=last)
        floor = pos.detach().floor()
        frac = pos.sub_(floor) if in_place else pos - floor
        # indices from a NaN-free floor: a NaN input then stays NaN in its own sample (through frac), as it does in
        # every other encoding, instead of becoming an out-of-range index that fails the whole batch
        index = floor.nan_to_num_(0.0).long()
        steps = torch.zeros_like(logits)
        steps[..., :-1] = logits[..., 1:] - logits[..., :-1]
        return cls(gates, positions, logits, steps, index, frac)

    def interpolated(self, inside: torch.Tensor | None, in_place: bool = False) -> torch.Tensor:
        """The logit at each fractional position, (..., L_i, L_m); zero past the sample's own grid (``inside``)."""
        lower, slope = self.logits.gather(-1, self.floor), self.steps.gather(-1, self.floor)
        out = lower.addcmul_(self.frac, slope) if in_place else torch.addcmul(lower, self.frac, slope)
        if inside is None:
            return out
        mask = inside[..., None, :].to(out.dtype)
        return out.mul_(mask) if in_place else out * mask


class ContextualPositionLogits(torch.autograd.Function):
    """:class:`LineTerms`' interpolated logits with their backward by hand: q, k (..., L, d) and the logits at integer
    positions (..., L, npos) -> (..., L, L). It saves the lines' queries and keys and the two matrix products (the
    gates, (..., L, L), and the logits) and makes the other terms again in backward: autograd kept some ten (..., L, L)
    tensors per axis and layer, so training checkpointed the vectors, which then were made twice and differentiated
    (ViT-S/16 448 px, batch 4, a layer's vectors forward and backward: 35-40 ms checkpointed, 21-23 ms through autograd
    holding every term, 23-24 ms by hand). The logits' own product (u @ emb) is autograd's."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, logits: torch.Tensor, scale: float,
                present: torch.Tensor | None, inside: torch.Tensor | None) -> torch.Tensor:
        gates = line_gates(q, k, scale)
        ctx.scale = scale
        ctx.save_for_backward(q, k, gates, logits, present, inside)
        return LineTerms.from_products(gates, logits, present).interpolated(inside, in_place=True)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, gates, logits, present, inside = ctx.saved_tensors
        terms = LineTerms.from_products(gates, logits, present)
        if inside is not None:
            grad = grad * inside[..., None, :].to(grad.dtype)
        # out = z[floor] + frac s[floor], s[p] = z[p + 1] - z[p] (the last s a constant 0): z[floor] gets grad, and
        # s[floor] grad frac, which is z[p + 1]'s and minus z[p]'s
        grad_steps = torch.zeros_like(logits).scatter_add_(-1, terms.floor, grad * terms.frac)[..., :-1]
        grad_logits = torch.zeros_like(logits).scatter_add_(-1, terms.floor, grad)
        grad_logits[..., :-1].sub_(grad_steps)
        grad_logits[..., 1:].add_(grad_steps)
        grad_pos = grad * terms.steps.gather(-1, terms.floor)
        grad_pos.masked_fill_(~(terms.positions <= logits.shape[-1] - 1), 0.0)  # clamp(max=): none past it (nor NaN)
        grad_gates = grad_pos @ keys_at_or_after(grad_pos.shape[-1], grad_pos).T  # g_j gets sum_{m <= j} of p_m's
        if present is not None:
            grad_gates.mul_(present[..., None, :].to(grad_gates.dtype))
        grad_scores = grad_gates.mul_(terms.gates).mul_(1 - terms.gates).mul_(ctx.scale)  # sigmoid, then the scale
        return grad_scores @ k, grad_scores.transpose(-1, -2) @ q, grad_logits, None, None, None


class TokenLogits(torch.autograd.Function):
    """u @ emb, (..., N, d) @ (d, P) -> (..., N, P), keeping ``u`` as given for backward: attention's strided q or k,
    held by attention anyway. torch.matmul keeps the contiguous copy it makes of a strided ``u`` instead, one (B, heads,
    N, d) tensor a layer held to the backward (ViT-S/16 448 px batch 4 training step: 1,140 MB of live tensors at the
    peak with it, against 1,085 MB before the logits of every axis came from one product)."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(u, emb)
        return u @ emb

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, emb = ctx.saved_tensors
        grad_u = grad @ emb.T if ctx.needs_input_grad[0] else None
        grad_emb = u.reshape(-1, u.shape[-1]).T @ grad.reshape(-1, grad.shape[-1]) if ctx.needs_input_grad[1] else None
        return grad_u, grad_emb


def token_logits(u: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """Every token's position logits u @ emb (:class:`TokenLogits` where gradients are taken, outside a compiled
    graph)."""
    if differentiated(u, emb) and not torch.compiler.is_compiling():
        return TokenLogits.apply(u, emb)
    return u @ emb


def line_vectors(q: torch.Tensor, k: torch.Tensor, logits: torch.Tensor, scale: float,
                 present: torch.Tensor | None = None, inside: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`contextual_position_logits` from the logits at integer positions (..., L, npos), made beforehand. With
    gradients (outside a compiled graph), :class:`ContextualPositionLogits`, its backward by hand; without, each term
    written over the one before."""
    grad = differentiated(q, k, logits)
    if grad and not torch.compiler.is_compiling():
        return ContextualPositionLogits.apply(q, k, logits, scale, present, inside)
    terms = LineTerms.from_products(line_gates(q, k, scale), logits, present, in_place=not grad)
    return terms.interpolated(inside, in_place=not grad)


def contextual_position_logits(
    q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, scale: float, key_mode: bool,
    present: torch.Tensor | None = None, inside: torch.Tensor | None = None,
) -> torch.Tensor:
    """One axis of SaPE^2 along the second-to-last token axis.

    q, k: (..., L, d) tokens of one line (row or column); emb: (d, npos). Returns (..., L, L): for query i,
    the interpolated logit of every position m in its line. Per-token inputs scattered onto a grid mark which cells
    hold a token (``present``, (..., L): an empty cell gates nothing) and which positions lie inside the sample's own
    grid (``inside``, (..., L): a position past it has no logit, so that a padded sample scores as it does alone).
    """
    logits = (k if key_mode else q) @ emb  # z_i[p] at integer p: (..., L, npos)
    return line_vectors(q, k, logits, scale, present, inside)


#: elements of one block of lines' (B, heads, lines, L, L) gates on the blockwise path without gradients (no N x N bias
#: held; with gradients the lines keep only their inputs and products for backward, and go at once): the lines
#: are taken a block at a time, so that the ten or so such temporaries of :func:`contextual_position_logits` stay
#: small (1 MB each). Where the whole (B, heads, N, N) bias is formed, every line goes at once: all of a temporary is
#: (B, heads, N, L), a fraction L/N of that bias, and each block costs some fifteen kernel launches (a GPU's time)
LINE_BLOCK_ELEMENTS = 1 << 18
#: bytes of one block of query rows' (B, heads, rows, N) distance temporaries where the whole bias is formed on CPU
#: with gradients. Formed at once, each N x N temporary (both axes' ``cdist``, their sum, the padded bias) is a fresh
#: allocation in every layer, which glibc maps anew: faulting those pages in cost more than the distances themselves
#: (ViT-B/16, 448 px, batch 2, `python -m lab bench`: 2.42x timm's ViT-B with the bias at once, 1.52x in blocks;
#: docs/speed.md). Blocks this small are reused from the heap. A GPU's caching allocator has no such cost, and there
#: each block would cost kernel launches: one block
CPU_ROW_BLOCK_BYTES = 8 << 20
#: bytes of one chunk of distances per axis where they are written in place (CPU, no gradients: :class:`SaPE2State`):
#: the forward's distance memories stay this small. A chunk is query rows of one (batch, head) pair first, then of a few
#: pairs: chunks of rows across every pair held one row each at ViT-B/16, 1024 px, batch 8 (a (8, 12, 1, 4096) row is
#: 1.5 MB), so each matmul was a matrix-vector product, 12x slower than 128 rows of one pair. Chunks split the rows and
#: the pairs evenly (:func:`~pape_hub.encodings.base.row_blocks`), and hold a whole pair where one fits: each chunk
#: costs its kernels' start (a 116-row product with a (30, 784) factor took 73 us, a 784-row one 225 us). ViT-B/16 448
#: px, batch 2, a layer's bias over 25 interleaved rounds (ad hoc, docs/speed.md): 2 MB chunks of 668 and 116 rows took
#: 1.28x as long as these 4 MB ones (one pair's 784 rows), 1.06x while the machine was quiet and 1.4x while it was busy;
#: chunks of three pairs (8 MB) 1.25x, out of the cache
IN_PLACE_ROWS_BYTES = 4 << 20


#: torch.cdist's matmul form (``use_mm_for_euclid_dist_if_necessary``) from this many points on a side; below it takes
#: direct differences. :func:`gram_distances_into` takes the same form from the same size, so its distances are cdist's
#: bit for bit
CDIST_MM_FROM = 26


@dataclass
class SaPE2State:
    """What the layers of one forward share (:meth:`SaPE2.prepare`).

    ``grid``: (rows, cols) or (T, rows, cols); ``plan``: where per-token inputs sit on that grid
    (:func:`scatter_plan`), None where the batch shares one grid. ``memory``: on CPU without gradients, the named
    memories every layer writes its bias, its blocks of bias rows and their distances into (:meth:`scratch`), made
    by the first layer that needs them. A fresh N x N tensor in every layer costs more than its distances: over
    glibc's largest heap block (32 MB; ViT-B/16 at 448 px from batch 2) each is mapped and faulted in anew, and
    under it the freed blocks of the blockwise path stay resident (docs/speed.md gives both, measured). So on CPU
    without gradients each :meth:`SaPE2.attn_bias` call with this state overwrites the bias the previous call
    returned, and each block of :meth:`SaPE2.attn_bias_rows` the one before: the model's attention uses each before
    the next is made; a caller who keeps one takes a copy."""

    grid: tuple[int, ...]
    plan: dict[str, Any] | None = None
    memory: dict[str, torch.Tensor] = field(default_factory=dict)

    def scratch(self, name: str, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A contiguous ``shape`` tensor in ``like``'s dtype and device: the start of this forward's memory ``name``,
        made anew only where it is too small or the dtype or device change (a last, shorter block reuses it)."""
        size = math.prod(shape)
        memory = self.memory.get(name)
        if memory is None or memory.numel() < size or memory.dtype != like.dtype or memory.device != like.device:
            memory = self.memory[name] = like.new_empty(size)
        return memory[:size].view(shape)

    def release(self, *names: str) -> None:
        """Drops the memories ``names``: a tensor made from one stays valid (it keeps its storage) until dropped."""
        for name in names:
            self.memory.pop(name, None)


def lines_in_blocks(q: torch.Tensor, k: torch.Tensor, logits: torch.Tensor, scale: float,
                    present: torch.Tensor | None, inside: torch.Tensor | None,
                    block_elements: int | None = None) -> torch.Tensor:
    """:func:`line_vectors` of every line, a block of at most ``block_elements`` gates at a time (all at once for None;
    lines are independent): q, k (B, H, *others, L, d) and the logits at integer positions (B, H, *others, L, npos);
    present (B, 1, *others, L) and inside (B, 1, *ones, L) as there. Returns (B, H, *others, L, L)."""
    B, H, *others, L, _ = q.shape
    lines = math.prod(others)
    step = lines if block_elements is None else max(1, block_elements // max(1, B * H * L * L))
    if step >= lines:
        return line_vectors(q, k, logits, scale, present, inside)
    flat = lambda t: t.flatten(2, -3)  # noqa: E731 - (B, H|1, *others, L, ...) -> (B, H|1, lines, L, ...)
    q, k, logits = flat(q), flat(k), flat(logits)
    present = present.expand(B, 1, *others, L).flatten(2, -2) if present is not None else None
    inside = inside.expand(B, 1, *others, L).flatten(2, -2) if inside is not None else None
    blocks = [line_vectors(
        q[:, :, i : i + step], k[:, :, i : i + step], logits[:, :, i : i + step], scale,
        present[:, :, i : i + step] if present is not None else None,
        inside[:, :, i : i + step] if inside is not None else None) for i in range(0, lines, step)]
    return torch.cat(blocks, dim=2).unflatten(2, tuple(others))


def pairwise_l2(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
    """(..., N, L) -> (..., N, N) Euclidean distances (to ``y`` (..., M, L): (..., N, M)); in float32 for 16-bit
    inputs on CPU, where ``cdist`` has no half-precision kernel."""
    y = x if y is None else y
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        return torch.cdist(x.float(), y.float()).to(x.dtype)
    return torch.cdist(x, y)


def gram_keys(v: torch.Tensor) -> torch.Tensor:
    """(..., N, L) -> the keys' side of every squared distance in torch.cdist's own matmul form, (..., N, L + 2)
    [v, 1, |v|^2]: made once per layer, where cdist would make it again for every block of query rows. A block's
    queries' side comes from its rows of it (:func:`gram_queries`), so that a layer holds one factor, not two."""
    norm = v.pow(2).sum(-1, keepdim=True)
    return torch.cat([v, torch.ones_like(norm), norm], -1)


def gram_queries(keys: torch.Tensor) -> torch.Tensor:
    """Rows (..., r, L + 2) of :func:`gram_keys` -> the queries' side [-2 v, |v|^2, 1], (..., r, L + 2): the same
    values cdist's form makes from v (-2 v is exact), so that queries @ keys^T = |a|^2 - 2 a.b + |b|^2."""
    width = keys.shape[-1] - 2
    return torch.cat([keys[..., :width].mul(-2), keys[..., width + 1 :], keys[..., width : width + 1]], -1)


def gram_distances_into(out: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Euclidean distances from :func:`gram_queries` (..., r, L + 2) and :func:`gram_keys` transposed, (..., L + 2, N)
    (a view, as cdist passes them, so that the matmul is the same kernel with the same bits), written into ``out``
    (..., r, N), contiguous: torch.cdist's values bit for bit from :data:`CDIST_MM_FROM` points, without its
    allocations (no autograd)."""
    return torch.matmul(queries, keys, out=out).clamp_min_(0).sqrt_()


def sum_into(out: torch.Tensor, terms: list[torch.Tensor], in_place: bool) -> None:
    """``out`` (..., r, N), a strided view of the bias, becomes the sum of the axes' distances ``terms`` (each of its
    shape); ``in_place``: the first term may be summed into (it is scratch)."""
    partial = terms[0]
    for d in terms[1:-1]:  # summed pairwise: no zero to start from
        partial = partial.add_(d) if in_place else partial + d
    if torch.is_grad_enabled() or torch.compiler.is_compiling():  # out= has no autograd, and a strided out= breaks a
        out.copy_(partial + terms[-1])  # compiled graph; a copy has neither problem
    else:  # the last sum written in place: no (B, H, r, N) temporary
        torch.add(partial, terms[-1], out=out)


def bias_rows_of(start: int, stop: int, *vectors: torch.Tensor, prefix: int, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Rows ``start:stop`` of eq. 16's bias, (B, H, rows, P+N), from every patch token's scaled SaPE vectors ((B, H, N,
    L) per axis): the sum over axes of the distances, zero in the ``prefix`` rows and columns; into ``out`` where given
    (a block of the whole bias). All rows' distances are taken before the block is made, so that their own temporaries
    are freed by then, not beside it (and in one call: no loop over sizes that torch.export keeps symbolic)."""
    first, last = max(start, prefix) - prefix, stop - prefix  # the block's patch rows
    terms = [pairwise_l2(v[:, :, first:last], v) for v in vectors]  # per axis (B, H, last - first, N)
    B, H, N, _ = vectors[0].shape
    out = vectors[0].new_empty(B, H, stop - start, prefix + N) if out is None else out
    head = stop - start - (last - first)  # prefix rows in the block: no bias, as the prefix columns
    out[:, :, :head].zero_()
    out[:, :, head:, :prefix].zero_()
    sum_into(out[:, :, head:, prefix:], terms, in_place=False)
    return out


class DistanceRowsByHand:
    """Eq. 16's bias rows added into a block of attention logits, and their gradient by hand (the
    :class:`~pape_hub.encodings.base.BiasRowsByHand` of :meth:`SaPE2.distance_rows`): the distances in torch.cdist's
    matmul form, each axis's keys' side (:func:`gram_keys`) made once a layer, not once a block as cdist does, and added
    into the logits without a bias block; their gradient by the chain rule through that form, without autograd.
    ``vectors``: every patch token's scaled SaPE vectors, (B, H, N, L) per axis (L: that axis's line length); ``prefix``
    rows and columns get no bias. Each block's distances are kept from :meth:`add_rows` to :meth:`backward_rows` of the
    same rows. The keys' side and its gradient are held transposed, (B * H, L + 2, N): the backward's products then
    have N as their long side (ViT-S/16 448 px, batch 4, one block: 0.8 ms each, 1.3 ms with (N, L + 2))."""

    def __init__(self, *vectors: torch.Tensor, prefix: int) -> None:
        self.prefix, self.shapes = prefix, [v.shape for v in vectors]
        self.keys = [gram_keys(v.detach()).flatten(0, 1) for v in vectors]  # per axis (B * H, N, L + 2)
        self.keys_t = [keys.mT.contiguous() for keys in self.keys]  # (B * H, L + 2, N)
        self.grad_keys_t: list[torch.Tensor | None] = [None] * len(vectors)
        self.block: list[tuple[torch.Tensor, torch.Tensor]] = []  # per axis: a block's queries' side and distances

    def patch_part(self, t: torch.Tensor, start: int, stop: int) -> tuple[torch.Tensor, int, int]:
        """(B, H, stop - start, T) -> its patch rows and columns (B * H, rows, N), a view; and those rows' span among
        the patches."""
        first, last = max(start, self.prefix) - self.prefix, stop - self.prefix
        return t.flatten(0, 1)[:, stop - start - (last - first) :, self.prefix :], first, last

    def add_rows(self, logits: torch.Tensor, start: int, stop: int) -> None:
        target, first, last = self.patch_part(logits, start, stop)
        self.block = []
        for keys, keys_t in zip(self.keys, self.keys_t):
            queries = gram_queries(keys[:, first:last])  # (B * H, rows, L + 2)
            distances = torch.bmm(queries, keys_t).clamp_min_(0).sqrt_()  # (B * H, rows, N), as gram_distances_into
            target.add_(distances)
            self.block.append((queries, distances))

    def backward_rows(self, grad_logits: torch.Tensor, start: int, stop: int) -> None:
        grad, first, last = self.patch_part(grad_logits, start, stop)
        for axis, (keys_t, (queries, distances)) in enumerate(zip(self.keys_t, self.block)):
            width = keys_t.shape[-2] - 2
            # d sqrt(g) / dg = 1 / (2 sqrt(g)); 0 where the distance is 0 (torch.cdist's subgradient there): there the
            # quotient is inf or NaN, zeroed in one pass (a mask took two). A non-finite logit gradient is zeroed too,
            # here only: q, k and v get it as it is
            ratio = grad.div(distances).nan_to_num_(0.0, 0.0, 0.0)  # (B * H, rows, N)
            if self.grad_keys_t[axis] is None:
                self.grad_keys_t[axis] = torch.zeros_like(keys_t)
            grad_keys_t = self.grad_keys_t[axis]
            grad_keys_t.baddbmm_(queries.mT, ratio, alpha=0.5)  # g = queries keys^T
            grad_queries_t = torch.bmm(keys_t, ratio.mT).mul_(0.5)  # (B * H, L + 2, rows)
            rows_t = grad_keys_t[:, :, first:last]  # queries [-2 v, |v|^2, 1] from these rows of keys [v, 1, |v|^2]
            rows_t[:, :width].add_(grad_queries_t[:, :width], alpha=-2.0)
            rows_t[:, width + 1].add_(grad_queries_t[:, width])
        self.block = []

    def grads(self) -> tuple[torch.Tensor | None, ...]:
        """The vectors' gradients from their keys' sides': keys [v, 1, |v|^2] give grad_v = grad[:L] + 2 v grad[L+1]."""
        return tuple(None if grad_t is None else torch.addcmul(
            grad_t[:, : shape[-1]].mT, keys[..., : shape[-1]], grad_t[:, -1:].mT, value=2.0).reshape(shape)
            for keys, grad_t, shape in zip(self.keys, self.grad_keys_t, self.shapes))


def in_place_distance_sums(target: torch.Tensor, keys_of_axes: list[torch.Tensor], vectors: list[torch.Tensor],
                           state: SaPE2State, first: int, last: int) -> None:
    """``target`` (B * H, last - first, N), scratch, becomes the sum over axes of the distances of patch rows
    ``first:last`` to every patch, a chunk of :data:`IN_PLACE_ROWS_BYTES` at a time: rows of one (batch, head) pair (a
    matrix product's rows), then as many pairs as fit, both split evenly. From each axis's keys' side (B * H, N, L + 2)
    where given (the queries' side of the rows made once: a fraction (L + 2) / N of the rows; made per chunk it cost 5%
    of a forward at ViT-B/16 448 px in small kernels), else from the SaPE vectors (B, H, N, L); the distances into
    ``state``'s memories."""
    pairs_total, _, N = target.shape
    if last <= first or not pairs_total:  # a block of prefix rows alone: nothing to write
        return
    row_bytes = N * target.element_size()
    row_spans = row_blocks(last - first, max(1, IN_PLACE_ROWS_BYTES // row_bytes), even=True)  # among these rows
    rows_most = row_spans[0][1] - row_spans[0][0]
    pair_spans = row_blocks(pairs_total, max(1, IN_PLACE_ROWS_BYTES // (rows_most * row_bytes)), even=True)
    queries = [gram_queries(keys[:, first:last]) for keys in keys_of_axes]  # (B * H, last - first, L + 2)
    flat = [v.flatten(0, 1) for v in vectors]  # (B * H, N, L)
    for pairs in (slice(*span) for span in pair_spans):
        for at, upto in row_spans:
            terms = [gram_distances_into(
                state.scratch(f"distances{axis}", keys, (pairs.stop - pairs.start, upto - at, N)),
                queries[axis][pairs, at:upto], keys[pairs].mT)
                for axis, keys in enumerate(keys_of_axes)] if keys_of_axes else \
                [pairwise_l2(v[pairs, first + at : first + upto], v[pairs]) for v in flat]
            sum_into(target[pairs, at:upto], terms, in_place=True)


def writes_in_place(t: torch.Tensor) -> bool:
    """Whether SaPE²'s bias, its blocks and their distances go into the forward's memories (:class:`SaPE2State`): on
    CPU, without autograd (which needs each block its own tensor), outside a compiled graph (which would capture one
    forward's memory)."""
    return t.device.type == "cpu" and not torch.is_grad_enabled() and not torch.compiler.is_compiling()


def scatter_plan(pos: TokenPositions) -> dict[str, Any]:
    """Where per-token inputs sit on one grid that holds every sample: ``cell`` (B, N), each token's flat cell index
    in grid order; ``present`` (B, cells), which cells hold a valid token; ``extent`` (B, p), each sample's own grid
    in coordinate order; ``grid``, the shared grid (grid order). SaPE^2 counts along rows and columns, so the
    coordinates must be whole patch indices, one token a cell; a packed row has several images in one grid and is
    refused."""
    if pos.segments is not None:
        raise ValueError("sape2 counts tokens along the rows and columns of one image's grid, so it cannot take a "
                         "packed row of several images: pass them as a padded batch (one image a row)")
    steps = pos.axis_scale
    index = pos.coords / steps  # (B, N, p) patch indices
    cells = index.round()
    valid = pos.valid if pos.valid is not None else torch.ones(index.shape[:2], dtype=torch.bool, device=index.device)
    if ((index - cells).abs() > 1e-4)[valid].any() or (cells < 0)[valid].any():
        raise ValueError("sape2 counts tokens along the rows and columns of a grid, so per-token coordinates must be "
                         "whole, non-negative patch indices (timm's patch_coord); free coordinates have no rows")
    cells = cells.long().masked_fill(~valid[..., None], 0)
    extent = pos.sample_grid_sizes()[:, 0]  # (B, p) coordinate order: one image a row
    grid = tuple(int(v) for v in extent.amax(0).flip(0))  # grid order: (H, W) / (T, H, W)
    flat = cell_index(cells, grid[::-1])  # (B, N)
    flat = torch.where(valid, flat, torch.full_like(flat, math.prod(grid)))  # padding to a spare cell
    present = cell_counts(flat, math.prod(grid))
    if (present > 1).any():
        raise ValueError("sape2 found two tokens at one grid cell of a sample; each patch index may appear once")
    return dict(cell=flat.clamp(max=math.prod(grid) - 1), present=present > 0, extent=extent, grid=grid, valid=valid)


def scatter_cells(t: torch.Tensor, plan: dict[str, Any]) -> torch.Tensor:
    """(B, H, N, d) tokens -> (B, H, cells, d), each valid token at its cell, zeros elsewhere."""
    B, H, _, d = t.shape
    cells = math.prod(plan["grid"])
    out = t.new_zeros(B, H, cells + 1, d)  # a spare cell takes the padding
    index = torch.where(plan["valid"], plan["cell"], torch.full_like(plan["cell"], cells))
    out.scatter_(2, index[:, None, :, None].expand(B, H, -1, d), t)
    return out[:, :, :cells]


def line_inside(extent: torch.Tensor, length: int, nd: int, dim: int) -> torch.Tensor:
    """(B, 1, *ones, L, *ones): which positions along grid dimension ``dim`` lie inside each sample's own grid
    (``extent`` (B,) cells along that axis)."""
    inside = torch.arange(length, device=extent.device)[None] < extent[:, None]  # (B, L)
    shape = [extent.shape[0], 1] + [length if d == dim else 1 for d in range(nd)]
    return inside.reshape(shape)


@register_encoding("sape2_ape", with_ape=True)
@register_encoding("sape2")
class SaPE2(AddsLearnedTable, PositionEncoding):
    """SaPE^2 (key mode by default), optionally with a learned absolute embedding; ``table_std`` is the std of the
    position-logit tables' init (default 0.02, the paper's)."""

    mechanisms = ("bias",)
    fused = False
    supported_ndims = (2, 3)
    grid_cells = True
    paper = "SaPE^2 (2025), key mode"

    def __init__(self, ctx: EncodingContext, mode: str = "key", num_positions: int | None = None,
                 with_ape: bool = False, table_std: float = 0.02) -> None:
        super().__init__(ctx)
        if not (math.isfinite(table_std) and table_std > 0):
            raise ValueError(f"SaPE2 table_std must be a positive number, got {table_std!r}")
        self.table_std = table_std
        if mode not in ("key", "query"):
            raise ValueError(f"SaPE2 mode must be 'key' or 'query', got {mode!r}")
        self.key_mode = mode == "key"
        self.num_positions = num_positions or max(ctx.grid_size) + 1
        # (depth, axis x/y(/t), head_dim, npos), shared by the heads of a layer as in the reference
        self.pos_emb = nn.Parameter(torch.zeros(ctx.depth, ctx.ndim, ctx.head_dim, self.num_positions))
        self.reset_parameters()
        self.add_learned_table(ctx, with_ape)

    def reset_parameters(self) -> None:
        """The position-logit tables: truncated normal (cut at +-2, as the reference's ``trunc_normal_``), std
        ``table_std``. The default 0.02 is the paper's appendix; on small grids it leaves the gates, SaPE²'s only
        positional pathway, with almost no signal or gradient at the start (the docs' results measure what a larger std
        changes)."""
        trunc_normal_(self.pos_emb, std=self.table_std)

    def no_weight_decay(self) -> set[str]:
        """The position-logit tables (and APE's table) are position parameters: no weight decay."""
        return {"pos_emb"} | self.table_no_weight_decay()

    def prepare(self, pos: TokenPositions) -> SaPE2State:
        """The shared grid (rows, cols) / (T, rows, cols); for per-token coordinates, where each token sits on a
        grid that holds every sample (:func:`scatter_plan`)."""
        if not pos.per_sample:
            return SaPE2State(self.require_grid(pos, "sape2"))
        plan = scatter_plan(pos)
        return SaPE2State(plan["grid"], plan)

    def attn_bias(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: SaPE2State) -> torch.Tensor:
        """(B, heads, P+N, P+N). Per-token inputs are scattered onto their grid first (empty cells gate nothing,
        positions past a sample's own grid count for nothing), then read back in the tokens' order. On CPU the
        distances are taken a block of query rows at a time (:data:`CPU_ROW_BLOCK_BYTES`; without gradients
        :data:`IN_PLACE_ROWS_BYTES`, written into the forward's bias memory, which the next call overwrites:
        :class:`SaPE2State`); the values are the same."""
        rows = self.distance_rows(self.sape_vectors(layer, q, k, state), state)
        B, H, T, _ = q.shape
        if q.device.type != "cpu":
            return rows(0, T)
        step = max(1, CPU_ROW_BLOCK_BYTES // (B * H * T * q.element_size()))
        if torch.is_grad_enabled():  # autograd would copy the whole gradient for every block written in place
            return rows(0, T) if step >= T else torch.cat(
                [rows(start, min(start + step, T)) for start in range(0, T, step)], dim=2)
        if writes_in_place(q):  # the rows take their distances a block at a time themselves
            return rows(0, T, out=state.scratch("bias", q, (B, H, T, T)))
        bias = q.new_empty(B, H, T, T)
        for start in range(0, T, step):
            rows(start, min(start + step, T), out=bias[:, :, start : start + step])
        return bias

    def attn_bias_rows(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: SaPE2State
                       ) -> Callable[[int, int], torch.Tensor]:
        """The SaPE vectors of every token are made once per layer ((B, H, N, L) per axis, no N x N), then each
        block of query rows takes its distances to every key. On CPU without gradients each block is written into
        the forward's block memory, which the next block overwrites (:class:`SaPE2State`)."""
        # in training every line goes at once: with gradients the lines keep only their queries and keys for backward
        # (:class:`ContextualPositionLogits`), and blocks cost time
        grad = differentiated(q, self.pos_emb)
        vectors = self.sape_vectors(layer, q, k, state, None if grad else LINE_BLOCK_ELEMENTS)
        return self.distance_rows(vectors, state)

    def distance_rows(self, vectors: list[torch.Tensor], state: SaPE2State
                      ) -> Callable[..., torch.Tensor] | BiasRows:
        """Eq. 16 from every patch token's scaled SaPE vectors ((B, H, N, L) per axis, :meth:`sape_vectors`): rows
        ``start:stop`` of the bias, (B, H, rows, P+N), the sum over axes of the distances (:func:`bias_rows_of`).
        Prefix rows and columns get no bias. Rows are written into ``out`` where given (a block of the whole bias), else
        into a block of their own. Where the vectors need gradients, a :class:`BiasRows` of the vectors, with their
        gradient by hand (:class:`DistanceRowsByHand`).
        On CPU without gradients the blocks and their distances live in ``state``'s memories, and in float32 / float64
        the distances are cdist's matmul form with its keys' side made once per layer (:func:`gram_keys`): cdist's
        values, but for the rounding of a vector's distance to itself (0, the square root of rounding in this form),
        which moves with the chunks' sizes. There ``vectors`` is emptied, each axis's vectors dropped once its factor
        is made (the factor holds all the rows need; ViT-B/16, 1024 px, batch 8: 100 MB a tensor)."""
        p = self.ctx.num_prefix_tokens
        B, H, N, _ = vectors[0].shape
        if not writes_in_place(vectors[0]):
            rows_of = partial(bias_rows_of, prefix=p)
            if any(v.requires_grad for v in vectors):  # rows a backward can make again from the vectors alone
                return BiasRows(rows_of, tuple(vectors), partial(DistanceRowsByHand, prefix=p))
            return lambda start, stop, out=None: rows_of(start, stop, *vectors, out=out)
        gram = vectors[0].dtype in (torch.float32, torch.float64) and N >= CDIST_MM_FROM
        keys_of_axes: list[torch.Tensor] = []  # per axis (B * H, N, L + 2): the pairs flattened, as chunks take them
        while gram and vectors:
            keys_of_axes.append(gram_keys(vectors.pop(0)).flatten(0, 1))
        like = keys_of_axes[0] if gram else vectors[0]

        def rows(start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
            if out is None:
                out = state.scratch("block", like, (B, H, stop - start, p + N))
            first, last = max(start, p) - p, stop - p  # the block's patch rows
            head = stop - start - (last - first)  # prefix rows in the block: no bias, as the prefix columns
            out[:, :, :head].zero_()
            out[:, :, head:, :p].zero_()
            target = out.view(B * H, *out.shape[2:])[:, head:, p:]  # (B * H, last - first, N); out is scratch
            in_place_distance_sums(target, keys_of_axes, vectors, state, first, last)
            if stop == p + N:  # the layer's last block: its memories go when the attention drops it, not held through
                # the MLP, where the forward's peak is (ViT-B/16, 1024 px, batch 8: a 201 MB block); the next layer
                # makes them again, once a layer, not once a block
                state.release("block", *(f"distances{axis}" for axis in range(len(keys_of_axes))))
            return out

        return rows

    def sape_vectors(self, layer: int, q: torch.Tensor, k: torch.Tensor, state: SaPE2State,
                     line_block: int | None = None) -> list[torch.Tensor]:
        """Per axis (x, y(, t)), every patch token's SaPE vector: (B, H, N, L), the interpolated position logits of
        the positions along its line (eqs. 9-15), scaled by eq. 16's 1 / sqrt(d) (taken into the position-logit table,
        as ||s a - s b|| = s ||a - b||: no pass over the vectors); the lines ``line_block`` gates at a time
        (:func:`lines_in_blocks`)."""
        p, scale = self.ctx.num_prefix_tokens, self.ctx.head_dim**-0.5
        plan, grid = state.plan, tuple(state.grid)  # grid: (rows, cols) or (T, rows, cols)
        q, k = q[:, :, p:], k[:, :, p:]
        present = inside = None
        if plan is not None:  # (B, H, N, d) -> (B, H, cells, d), each token at its cell
            q, k = (scatter_cells(t, plan) for t in (q, k))
            present = plan["present"].unflatten(1, grid)[:, None]  # (B, 1, *grid)
        elif not differentiated(q, k):
            # copied once for every axis (the products copied each axis's lines from attention's strided q and k); not
            # with gradients, where the lines' products keep their inputs for backward: copies would be held beside
            # attention's own q and k (ViT-S/16 448 px, batch 4: 1,317 MB of live tensors at a step's peak, 1,196 MB
            # without)
            q, k = q.contiguous(), k.contiguous()
        nd = len(grid)
        emb = self.pos_emb[layer].to(q.dtype) * scale  # (nd, d, npos)
        npos = emb.shape[-1]
        logits = token_logits(k if self.key_mode else q, emb.permute(1, 0, 2).flatten(1))  # (B, H, cells, nd * npos)
        q_grid, k_grid, logits_grid = (t.unflatten(2, grid) for t in (q, k, logits))  # (B, H, *grid, ...)
        vectors = []
        for coord_axis in range(nd):  # x (along rows), y (along columns), t: coordinate order
            axis = 2 + nd - 1 - coord_axis  # its dimension in (B, H, *grid, d)
            last = 1 + nd  # the grid dimension next to d
            if plan is not None:  # (B, 1, *others, L) masks along this axis
                inside = line_inside(plan["extent"][:, coord_axis], grid[axis - 2], nd, axis - 2)
                inside = inside.movedim(axis, last)
            axis_logits = logits_grid[..., coord_axis * npos : (coord_axis + 1) * npos]
            along = lines_in_blocks(
                q_grid.movedim(axis, last), k_grid.movedim(axis, last), axis_logits.movedim(axis, last), scale,
                present.movedim(axis, last) if present is not None else None, inside, line_block)  # (B, H, ..., L, L)
            sape = along.movedim(-2, axis).flatten(2, 1 + nd)  # (B, H, cells, L): query order restored
            if plan is not None:
                sape = sape.gather(2, plan["cell"][:, None, :, None].expand(-1, sape.shape[1], -1, sape.shape[-1]))
            vectors.append(sape)
        return vectors
