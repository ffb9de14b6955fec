"""LieRE (Ostmeier et al. 2025): learned rotations R(p) = exp(sum_d p_d A_d) applied to queries and keys.

Each layer and head owns p skew-symmetric generators A_d, block-diagonal with blocks of ``block_size``
(8 for ``liere8``; the whole head for ``liere``, the paper's LieRE_64 at head dim 64). Block size 2 is
RoPE-Mixed with a different parameterisation. Head dims beyond the last full block stay unrotated.

Init as the reference: raw U(0, 2 pi) upper triangles, A = U - U^T. Positions as the reference: patch
coordinates divided by (training grid - 1) per axis, so the training grid spans [0, 1]; other grids keep
that spacing (extrapolation; the reference's ``linspace(0, S / S_train, S)`` stretches the spacing slightly
instead). CLS gets the identity rotation (a zero generator in the reference).

The reference code overwrites its per-layer rotations inside the layer loop, so every block there uses
layer 0's rotation and the other layers' generators get no gradient. Here each layer uses its own.

Rotations are computed in float32 (float64 for float64 coordinates), on CPU by :func:`rotation_exp` (scaling and
squaring, a chunk at a time; elsewhere and compiled, ``torch.linalg.matrix_exp``): at inference once per grid for all
layers (one layer at a time, cached: 0.46 GB for dense LieRE at ViT-B/16 224 px, 1.85 GB at 448, half that in bf16
under autocast; invalidated when the parameters change); in training once per step and layer, inside that layer (so
with gradient checkpointing they are recomputed there, and only one layer's intermediates live); on a grid whose layer
of rotations is over ``STATE_BYTES``, a block of tokens at a time, made again in backward (on CPU by
:class:`GeneratorRotation`, once; elsewhere checkpointed). On CPU, tokens on one ray from the origin share its
exponential (:class:`Rays`: R(g p) = R((g - 1) p) R(p)) where their rotations are made outside autograd (without
gradients, and in :class:`GeneratorRotation`), and a large grid's blocks are whole rays.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from .base import (
    STATE_BYTES,
    EncodingContext,
    PositionEncoding,
    TokenPositions,
    autocast_dtype,
    cell_counts,
    cell_index,
    compute_dtype,
    differentiated,
    full_precision,
    grid_positions,
)
from .registry import register_encoding

__all__ = ["BLOCK_BYTES", "CACHE_BYTES", "INFERENCE_BLOCK_BYTES", "LieRE", "rotation_exp", "skew_symmetric"]

#: every layer's rotations are cached across forwards (at inference, per grid; and, beside them, per rectangle of a
#: NaFlex batch's cells: :meth:`LieRE.cell_rotations`) while together they take at most this many bytes each (they
#: cost a matrix_exp per token, head and block to remake); above, each layer makes its own in every forward: memory
#: flat, time several-fold. The line is a trade-off the goals pull both ways on: LieRE-8 at ViT-S/16 896 px needs 462
#: MB to stay cached (5x a plain ViT's peak), dense LieRE at ViT-B/16 224 px 465 MB (without it, 3.3x timm's ViT-B
#: time). Raise it where time matters more than memory
CACHE_BYTES = 256 << 20
#: rotations made at a time on a large grid in training, each block through :class:`GeneratorRotation` (one grid on
#: CPU) or checkpointed (matrix_exp's temporaries are several times as large)
BLOCK_BYTES = 4 << 20
#: the same without gradients on CPU, each block's rotated queries and keys written straight into the layer's output
#: (on a GPU, blocks of BLOCK_BYTES). It was 1 MB while each block's exponentials had matrix_exp's temporaries, which
#: glibc kept on its heap (dense LieRE, ViT-S/16 at 896 px: 311-444 MB resident with 4 MB blocks kept in a list,
#: 109-116 MB with 1 MB blocks written into the output; `ape` 111 MB). Each block's Taylor polynomials now read the
#: layer's words once (:class:`TaylorPolynomials`: 18 MB for dense LieRE at ViT-B/16), so a block of a few tokens
#: costs more than its arithmetic. Dense LieRE, ad hoc, with 1, 4 and 8 MB blocks: ViT-B/16 448 px batch 2,
#: 10.6-11.4, 7.6-8.3 and 6.8-7.1 s a forward; ViT-S/16 896 px batch 1, 16-17, 12 and 12 s, resident peak +67, +78
#: and +88 MB (docs/speed.md)
INFERENCE_BLOCK_BYTES = 4 << 20
#: a NaFlex batch's queries and keys are rotated on the cells' rectangle (:meth:`LieRE.rotate_on_cells`) where it holds
#: at most this many times a sample's tokens: there each cell's rotation serves the whole batch, where the per-token
#: path gathers every token's own. Ad hoc, LieRE-8 at ViT-S/16, one layer of `python -m lab padding`'s batches of 8: the
#: NaFlex dict of 224 px squares (the rectangle holds 1x their tokens) 7.2-8.4 ms on the rectangle against 14.0-15.2 ms
#: gathered; the padded batch of 8 aspect ratios (2.9x) 16.2-18.5 ms against 13.0-15.6 ms
CELL_GRID_RATIO = 2


def skew_symmetric(raw: torch.Tensor) -> torch.Tensor:
    """(..., b, b) -> A = U - U^T with U the strict upper triangle of ``raw``."""
    upper = raw.triu(1)
    return upper - upper.transpose(-1, -2)


#: the largest bound on a generator sum's 2-norm once scaled by 2^-s for :func:`rotation_exp`'s Taylor polynomial of
#: degree 12: its truncation error is at most theta^13 / 13! / (1 - theta / 14), under the unit roundoff (2^-24 in
#: float32: theta 1.5 gives 5.4e-8; 2^-53 in float64: theta 0.33 gives 9.2e-17). The sums are skew-symmetric, so
#: normal: every power's 2-norm is the sum's to that power, and the terms and remainder are bounded by it
TAYLOR_THETA = {torch.float32: 1.5, torch.float64: 0.33}
#: the Taylor polynomial's degree
TAYLOR_DEGREE = 12
#: matrices :func:`rotation_exp` squares at a time: a chunk's buffers stay in a core's cache, and they are small enough
#: for the C allocator to reuse between layers (dense LieRE at ViT-S/16, 448 px, one layer: forward 1.05 s in one
#: piece, 0.31 s in 1 MB chunks)
EXP_CHUNK_BYTES = 1 << 20
#: 1 / k! for the Taylor polynomial
_INVERSE_FACTORIALS = [1 / math.factorial(k) for k in range(TAYLOR_DEGREE + 1)]


def squaring_counts(bounds: torch.Tensor) -> torch.Tensor:
    """Bounds on generator sums' 2-norms (any shape) -> the fewest halvings s (int64) that bring each under
    :data:`TAYLOR_THETA`; 0 for a zero bound, and for a non-finite one (its exponential is not finite either way)."""
    squarings = torch.log2(bounds / TAYLOR_THETA[bounds.dtype]).ceil().clamp(min=0)
    return squarings.nan_to_num(0.0, posinf=0.0).long()


def squared_prefixes(squarings: torch.Tensor) -> list[int]:
    """``squarings`` (n,) in descending order -> how many matrices each squaring step takes: step j squares the
    first count_j, those with more than j squarings."""
    per_count = torch.bincount(squarings).tolist()  # matrices with 0, 1, ... squarings
    return [sum(per_count[step + 1 :]) for step in range(len(per_count) - 1)]


@functools.lru_cache
def word_tree(ndim: int) -> tuple[torch.Tensor, tuple[tuple[int, tuple[torch.Tensor, ...]], ...]]:
    """The monomials z^alpha in ``ndim`` variables up to :data:`TAYLOR_DEGREE`, by degree: their exponents (M, ndim)
    (M = 91 for two variables, 455 for three), and for each degree k >= 1 its number of monomials and, for each
    variable d, where beta + e_d falls among them for each beta of degree k - 1 (in order)."""
    degrees: list[list[tuple[int, ...]]] = [[(0,) * ndim]]
    children = []
    for _ in range(TAYLOR_DEGREE):
        place: dict[tuple[int, ...], int] = {}
        row = []
        for d in range(ndim):
            lifted = (tuple(a + (i == d) for i, a in enumerate(beta)) for beta in degrees[-1])
            row.append(torch.tensor([place.setdefault(alpha, len(place)) for alpha in lifted]))
        degrees.append(list(place))  # in the order first reached
        children.append((len(place), tuple(row)))
    return torch.tensor([alpha for degree in degrees for alpha in degree]), tuple(children)


def taylor_words(generators: torch.Tensor) -> torch.Tensor:
    """(B, p, b, b) generators A_d -> (B, M, b, b) words S_alpha (:func:`word_tree`'s order): the sum of every product
    with alpha_d factors A_d, so that (sum_d z_d A_d)^k = sum_{|alpha| = k} z^alpha S_alpha. Built by degree, from the
    products that start with A_d: S_alpha = sum_d A_d S_(alpha - e_d). Autograd takes the generators' gradient."""
    batch, ndim, b, _ = generators.shape
    level = torch.eye(b, dtype=generators.dtype, device=generators.device).expand(batch, 1, b, b)
    levels = [level]
    for size, row in word_tree(ndim)[1]:
        words = generators.new_zeros(batch, size, b, b)
        for d, child in enumerate(row):  # (B, 1, b, b) @ (B, size_k-1, b, b): A_d times every word of degree k - 1
            words = words.index_add(1, child.to(generators.device), generators[:, d, None] @ level)
        levels.append(words)
        level = words
    return torch.cat(levels, dim=1)


def taylor_coefficients(z: torch.Tensor) -> torch.Tensor:
    """(n, p) -> (M, n): z^alpha / |alpha|! for every monomial of :func:`word_tree`, each row a monomial (the layout
    a row gather of the powers makes fast)."""
    exponents = word_tree(z.shape[-1])[0].to(z.device)
    powers = torch.cat([torch.ones_like(z[..., None]), z[..., None].expand(*z.shape, TAYLOR_DEGREE)], -1).cumprod(-1)
    powers = powers.permute(1, 2, 0).contiguous()  # (p, degree + 1, n)
    inverse = torch.tensor(_INVERSE_FACTORIALS, dtype=z.dtype, device=z.device)[exponents.sum(-1)]
    out = powers[0].index_select(0, exponents[:, 0]) * inverse[:, None]
    for d in range(1, z.shape[-1]):
        out *= powers[d].index_select(0, exponents[:, d])
    return out


def normalised_words(skew: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, G, p, b, b) skew generators -> each one's 2-norm a_d (K, G, p), a constant (1 for a zero one), and the
    :func:`taylor_words` of A_d / a_d (K, G, M, b, b), with autograd. Normalised, a word's 2-norm is at most the
    number of products it sums, whatever the generators' scale (unnormalised, dense LieRE's degree-12 words reach
    1e31 in float32); the positions take the norms instead (:class:`TaylorPolynomials`). The 2-norm (an SVD of each
    generator, once a layer) is 0.56-0.61 of the 1-norm at the reference's init: about 0.7 squarings fewer a matrix."""
    gains = torch.linalg.matrix_norm(skew.detach().nan_to_num(0.0, 0.0, 0.0), ord=2)  # non-finite: words carry it
    gains = gains.where(gains > 0, torch.ones_like(gains))
    normalised = (skew / gains[..., None, None]).flatten(0, 1)
    if normalised.requires_grad:  # remade in backward: autograd would keep each degree's words and products, three
        # times the words (dense LieRE at ViT-S/16: 27 MB a layer, held for every layer until backward)
        return gains, checkpoint(taylor_words, normalised, use_reentrant=False).unflatten(0, skew.shape[:2])
    return gains, taylor_words(normalised).unflatten(0, skew.shape[:2])


class TaylorPolynomials(NamedTuple):
    """The degree-12 Taylor polynomial of exp(x / 2^s) for every generator sum x = sum_d p_d A_d: sum_alpha c_alpha
    S_alpha, with the :func:`normalised_words` S_alpha of its head and block and c_alpha = z^alpha / |alpha|! for
    z_d = p_d a_d 2^-s. The words are shared by every token, so the polynomials of a head and block are one matrix
    product (tokens, M) @ (M, b^2), where Paterson-Stockmeyer took five b x b products per token and its backward more
    (docs/speed.md). Each sum is scaled by the power of two that brings sum_d |z_d|, a bound on its 2-norm, under
    :data:`TAYLOR_THETA`: that bounds the terms as well as the truncation (scaled by the sum's own norm, terms that
    cancel where positions or generators do lost 2x2 blocks' translation invariance to 4e-9 in float64), and it takes
    no b x b work per token."""

    coefficients: torch.Tensor  #: (M, K, N, G)
    polynomials: torch.Tensor  #: (K * N * G, b, b)
    squarings: torch.Tensor  #: (K * N * G,)

    @classmethod
    def of(cls, pos: torch.Tensor, words: torch.Tensor, gains: torch.Tensor) -> TaylorPolynomials:
        """``pos`` (N, p) and :func:`normalised_words`' ``gains`` (K, G, p) and ``words`` (K, G, M, b, b)."""
        heads, blocks, ndim = gains.shape
        z = pos.abs()[:, None] * gains[:, None]  # (K, N, G, p): |p_d| a_d, a bound on each term's 2-norm
        squarings = squaring_counts(z.sum(-1))
        z = pos[:, None] * gains[:, None] * torch.exp2(-squarings.to(pos.dtype))[..., None]
        coefficients = taylor_coefficients(z.reshape(-1, ndim)).view(-1, heads, pos.shape[0], blocks)
        polynomials = torch.einsum("mkng,kgmx->kngx", coefficients, words.detach().flatten(-2))
        b = words.shape[-1]
        return cls(coefficients, polynomials.reshape(-1, b, b), squarings.flatten())  # (K, N, G): a copy if G > 1

    def words_grad(self, grad: torch.Tensor) -> torch.Tensor:
        """The words' gradient (K, G, M, b, b) from the polynomials' (K * N * G, b, b): one product per head and
        block."""
        _, heads, tokens, blocks = self.coefficients.shape
        b = grad.shape[-1]
        flat = grad.view(heads, tokens, blocks, b * b)
        return torch.einsum("mkng,kngx->kgmx", self.coefficients, flat).unflatten(-1, (b, b))


def sorted_chunks(taylor: TaylorPolynomials) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """:data:`EXP_CHUNK_BYTES` of matrices at a time, most squarings first (a stable sort, so the forward and the
    backward take the same chunks): each chunk's indices, its Taylor polynomials (a copy) and
    :func:`squared_prefixes`."""
    squarings, order = taylor.squarings.sort(descending=True, stable=True)
    polynomials = taylor.polynomials
    step = max(1, EXP_CHUNK_BYTES // max(1, polynomials[:1].numel() * polynomials.element_size()))
    for start in range(0, polynomials.shape[0], step):
        index = order[start : start + step]
        yield index, polynomials.index_select(0, index), squared_prefixes(squarings[start : start + step])


def squared_powers(exp: torch.Tensor, counts: list[int]) -> Iterator[torch.Tensor]:
    """The squaring steps of a sorted chunk: ``exp`` (n, b, b), then the first count_j matrices of each step squared,
    (count_j, b, b); one at a time, so that a caller that keeps none holds two."""
    yield exp
    for count in counts:
        exp = torch.bmm(exp[:count], exp[:count])
        yield exp


def exponentials(taylor: TaylorPolynomials) -> torch.Tensor:
    """The exponentials (n, b, b) of :class:`TaylorPolynomials`: each squared as often as it was halved; no
    autograd."""
    out = torch.empty_like(taylor.polynomials)
    for index, polynomials, counts in sorted_chunks(taylor):
        for power, done in zip(squared_powers(polynomials, counts), [*counts, 0]):
            out.index_copy_(0, index[done : power.shape[0]], power[done:])  # squared no more
    return out


def each_exponential(powers: list[torch.Tensor], counts: list[int]) -> torch.Tensor:
    """A sorted chunk's exponentials (n, b, b) from its :func:`squared_powers`: each matrix's at its own count."""
    exp = torch.empty_like(powers[0])
    for power, done in zip(powers, [*counts, 0]):
        exp[done : power.shape[0]] = power[done:]
    return exp


def kept_squarings(taylor: TaylorPolynomials) -> list[tuple[torch.Tensor, list[torch.Tensor], list[int]]]:
    """Every :func:`sorted_chunks` chunk's indices, :func:`squared_powers` and counts, kept (what :func:`exp_backward`
    makes one chunk at a time, for a caller that needs every exponential before any gradient)."""
    return [(index, list(squared_powers(polynomials, counts)), counts)
            for index, polynomials, counts in sorted_chunks(taylor)]


def exp_backward(taylor: TaylorPolynomials,
                 chunk_grad: Callable[[torch.Tensor, list[torch.Tensor], list[int]], torch.Tensor],
                 chunks: list[tuple[torch.Tensor, list[torch.Tensor], list[int]]] | None = None) -> torch.Tensor:
    """The gradient for the words (K, G, M, b, b): each chunk's squarings made again from its polynomials (or taken
    from ``chunks``, :func:`kept_squarings`), then differentiated in reverse. ``chunk_grad(index, powers, counts)``
    gives the gradient for the chunk's exponentials (len(index), b, b), in its order; it may read their
    :func:`squared_powers`."""
    grad_in = torch.empty_like(taylor.polynomials)
    if chunks is None:
        chunks = ((index, list(squared_powers(polynomials, counts)), counts)
                  for index, polynomials, counts in sorted_chunks(taylor))
    for index, powers, counts in chunks:
        grad = chunk_grad(index, powers, counts)
        for count, power in zip(reversed(counts), reversed(powers[:-1])):  # E' = E E: E gets g E^T + E^T g
            before = power[:count]
            grad[:count] = torch.bmm(grad[:count], before.mT).baddbmm_(before.mT, grad[:count])
        grad_in.index_copy_(0, index, grad)
    return taylor.words_grad(grad_in)


class RotationExp(torch.autograd.Function):
    """:func:`rotation_exp`, its backward by hand: each chunk's squarings made again (no autograd), then differentiated
    in reverse, so that no chunk's intermediates outlive it; the polynomials' gradient goes to the words in one product
    per head and block, and autograd takes it to the generators. The matrices go sorted by their number of squarings,
    so that each squaring step is one matrix product over the first matrices of a chunk, those that still need it. It
    saves the positions, the words and the generators' norms."""

    @staticmethod
    def forward(ctx: Any, pos: torch.Tensor, words: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        out = exponentials(TaylorPolynomials.of(pos, words, gains))
        ctx.save_for_backward(pos, words, gains)
        heads, blocks, _, b, _ = words.shape
        return out.view(heads, pos.shape[0], blocks, b, b)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        taylor = TaylorPolynomials.of(*ctx.saved_tensors)
        flat = grad.reshape(taylor.polynomials.shape)
        return None, exp_backward(taylor, lambda index, powers, counts: flat.index_select(0, index)), None


def whole_coordinates(coords: torch.Tensor) -> torch.Tensor | None:
    """``coords`` as int64 where every coordinate is a whole number (a grid's, NaFlex's patch indices); else None
    (free tokens, interpolated grids). Rays from the origin and tables of cells both need them."""
    whole = coords.round()
    return whole.long() if torch.equal(whole, coords) else None


def ray_of_tokens(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(n, p) coordinates -> each token's ray from the origin (n,), an index, and its whole multiple g >= 1 along it
    (n,): the token is g p' for its ray's primitive point p' (whole coordinates with greatest common divisor 1; the
    origin is a ray of its own). None where a coordinate is not a whole number (free tokens, interpolated grids)."""
    whole = whole_coordinates(coords) if coords.ndim == 2 else None
    if whole is None:
        return None
    multiple = whole[:, 0].abs()
    for d in range(1, whole.shape[1]):
        multiple = torch.gcd(multiple, whole[:, d])  # non-negative
    multiple = multiple.clamp(min=1)  # the origin: multiple 1 of itself
    _, ray = torch.unique(whole // multiple[:, None], dim=0, return_inverse=True)  # exact division
    return ray, multiple


class Rays(NamedTuple):
    """Tokens that share a ray from the origin: on it the generator sums are g x' for one x', so they commute, and
    R(g p') = R((g - 1) p') R(p'): one b x b product a token where its exponential takes a Taylor polynomial and its
    squarings (some 7.8 products a matrix for dense LieRE at 448 px). On a grid from the origin about 39% of tokens lie
    past their ray's primitive point (gcd > 1). The rays go sorted by their last multiple, most first, so that the
    products for multiple g are one matrix product over the first rays, those that reach it."""

    first: torch.Tensor  #: (R,) a token of each ray, in the sorted order
    multiple: torch.Tensor  #: (R,) that token's multiple: its ray's primitive point is its position / multiple
    steps: list[int]  #: how many rays reach multiple 2, 3, ...
    take: torch.Tensor  #: (n,) each token's row among the multiples: R of multiple 1, steps[0] of 2, ...

    @classmethod
    def of(cls, coords: torch.Tensor) -> Rays | None:
        """The rays of (n, p) coordinates; None where a coordinate is not whole or no two tokens share a ray."""
        found = ray_of_tokens(coords)
        if found is None:
            return None
        ray, multiple = found
        count = int(ray.max()) + 1
        if count == ray.shape[0]:
            return None
        tokens = torch.arange(ray.shape[0], device=ray.device)
        last = torch.zeros(count, dtype=torch.long, device=ray.device).scatter_reduce_(0, ray, multiple, "amax")
        order = torch.argsort(last, descending=True, stable=True)  # rank -> ray
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(count, device=ray.device))
        reach = torch.bincount(last).flip(0).cumsum(0).flip(0)  # reach[g]: rays whose last multiple is g or more
        steps = reach[2:].tolist()
        starts = torch.tensor([0, count, *steps], device=ray.device).cumsum(0)  # each multiple's first row
        first = torch.full((count,), ray.shape[0], device=ray.device).scatter_reduce_(0, ray, tokens, "amin")[order]
        return cls(first, multiple[first], steps, starts[multiple - 1] + rank[ray])

    def primitives(self, pos: torch.Tensor) -> torch.Tensor:
        """(n, p) positions -> each ray's primitive point (R, p), in the sorted order."""
        return pos[self.first] / self.multiple[:, None].to(pos.dtype)

    def starts(self, per_row: int) -> list[int]:
        """Where each multiple's rows start among the table's matrices, ``per_row`` matrices a row."""
        starts = [0, len(self.first) * per_row]
        for count in self.steps:
            starts.append(starts[-1] + count * per_row)
        return starts

    def table(self, exp: torch.Tensor, heads: int, blocks: int) -> torch.Tensor:
        """The primitive points' exponentials (K * R * G, b, b), in (K, R, G) order -> every multiple's rotation,
        (rows, K, G, b, b): the R rays' first, then each multiple g >= 2 of the rays that reach it, R(g p') =
        R((g - 1) p') R(p')."""
        b, starts = exp.shape[-1], self.starts(heads * blocks)
        table = exp.new_empty(starts[-1] // (heads * blocks), heads, blocks, b, b)
        table[: len(self.first)] = exp.view(heads, -1, blocks, b, b).transpose(0, 1)
        matrices = table.view(-1, b, b)
        for before, at, stop in zip(starts, starts[1:], starts[2:]):  # the first rays' previous multiple, times R(p')
            torch.bmm(matrices[before : before + stop - at], matrices[: stop - at], out=matrices[at:stop])
        return table

    def table_grad(self, table: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """:meth:`table`'s backward: ``grad`` (rows, K, G, b, b), the table's, accumulated in place down the
        multiples -> the primitive points' exponentials' (K * R * G, b, b), in (K, R, G) order."""
        heads, blocks, b = table.shape[1], table.shape[2], table.shape[-1]
        matrices, grads, starts = table.view(-1, b, b), grad.view(-1, b, b), self.starts(heads * blocks)
        for before, at, stop in reversed(list(zip(starts, starts[1:], starts[2:]))):
            rows = stop - at  # R_g = R_(g-1) E: R_(g-1) gets G E^T, E gets R_(g-1)^T G
            grads[before : before + rows].baddbmm_(grads[at:stop], matrices[:rows].mT)
            grads[:rows].baddbmm_(matrices[before : before + rows].mT, grads[at:stop])
        return grad[: len(self.first)].transpose(0, 1).reshape(-1, b, b)

    def tokens(self, table: torch.Tensor) -> torch.Tensor:
        """Each token's rotation from the :meth:`table`, (K, n, G, b, b), contiguous: gathered in the layout that
        :meth:`LieRE.rotate` and :class:`GeneratorRotation` read (a transposed view made every cached layer's
        rotate copy its rotations again: LieRE-8 at ViT-B/16 224 px, 4 forward kernels a layer against 3)."""
        return table.transpose(0, 1).index_select(1, self.take)

    def exponentials(self, pos: torch.Tensor, words: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
        """Every token's rotation (K, n, G, b, b) from ``pos`` (n, p), the words and gains of :class:`RotationExp`,
        without autograd: each ray's primitive point by :func:`exponentials`, then each multiple from the one
        before."""
        exp = exponentials(TaylorPolynomials.of(self.primitives(pos), words, gains))
        return self.tokens(self.table(exp, *words.shape[:2]))


def rotation_exp(pos: torch.Tensor, skew: torch.Tensor, words: tuple[torch.Tensor, torch.Tensor] | None = None,
                 rays: Rays | None = None) -> torch.Tensor:
    """(N, p) positions, (K, G, p, b, b) skew generators -> R = exp(sum_d p_d A_d), (K, N, G, b, b), float32/float64,
    by scaling and squaring: each generator sum scaled by the power of two 2^-s that brings a bound on its 2-norm
    under :data:`TAYLOR_THETA`, a degree-12 Taylor polynomial (:class:`TaylorPolynomials`), then squared s times,
    :data:`EXP_CHUNK_BYTES` of matrices at a time. ``torch.linalg.matrix_exp`` does the same with a degree chosen per
    matrix, but on CPU it sorts its batch by degree with gathers and copies around every call, and its backward takes
    the exponential of a (2b, 2b) block matrix: one layer of LieRE-8 at ViT-S/16 448 px took 57 ms forward and 454 ms
    with backward there, dense LieRE 0.93 s and 6.05 s (docs/speed.md gives this function's). Its backward makes each
    chunk again (:class:`RotationExp`). ``words``: the generators' :func:`normalised_words`, where several calls share
    them (a layer's blocks of tokens). ``rays``: where given, the :class:`Rays` of the positions' whole coordinates,
    whose tokens past their ray's first point take a product each instead (no autograd)."""
    gains, taylor_words = normalised_words(skew) if words is None else words
    if rays is not None:
        return rays.exponentials(pos, taylor_words, gains)
    return RotationExp.apply(pos, taylor_words, gains)


class GeneratorRotation(torch.autograd.Function):
    """Queries and keys rotated by R = exp(sum_d p_d A_d), made from the positions and the skew generators, with no
    rotation kept: for LieRE's large grids in training on CPU. Checkpointing a block of tokens made its exponentials
    three times a step (forward, the checkpoint's remake, :class:`RotationExp`'s backward); here the backward makes
    each chunk's squarings once, and takes from them both the exponentials, for the queries' and keys' gradient, and
    the words' gradient (two makings and the differentiation, against three and it).
    qk: (2, B, H, T, G*b) with positions (T, p) shared by the batch, and the skew generators' (H, G, p, b, b)
    :func:`normalised_words` -> (2, B, H, T, G*b). ``rays``: the positions' :class:`Rays`, where tokens share them:
    then each ray's primitive point's squarings are kept through the backward (the products along the rays need
    every exponential before any gradient), the exponentials made from them, and both gradients taken through the
    products."""

    @staticmethod
    def forward(ctx: Any, qk: torch.Tensor, pos: torch.Tensor, words: torch.Tensor, gains: torch.Tensor,
                rays: Rays | None = None) -> torch.Tensor:
        b = words.shape[-1]
        if rays is None:
            rot = exponentials(TaylorPolynomials.of(pos, words, gains))
        else:
            rot = rays.exponentials(pos, words, gains).reshape(-1, b, b)  # (K * T * G, b, b)
        ctx.rays = rays
        ctx.save_for_backward(qk, pos, words, gains)  # qk as given (a view of the layer's): no copy per layer
        return from_columns(torch.bmm(rot, as_columns(qk, b)), qk.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qk, pos, words, gains = ctx.saved_tensors
        b = words.shape[-1]
        vectors, grad_vectors = as_columns(qk, b), as_columns(grad, b)  # (n, b, 2B)
        grad_rot = torch.bmm(grad_vectors, vectors.mT)  # rotated = R v: R gets g v^T, v gets R^T g
        if ctx.rays is not None:
            grad_qk, grad_words = ray_rotation_grads(ctx.rays, pos, words, gains, grad_rot, grad_vectors)
            return from_columns(grad_qk, qk.shape), None, grad_words, None, None
        taylor = TaylorPolynomials.of(pos, words, gains)
        grad_qk = torch.empty_like(vectors)

        def chunk_grad(index: torch.Tensor, powers: list[torch.Tensor], counts: list[int]) -> torch.Tensor:
            rot = each_exponential(powers, counts)
            grad_qk.index_copy_(0, index, torch.bmm(rot.mT, grad_vectors.index_select(0, index)))
            return grad_rot.index_select(0, index)

        grad_words = exp_backward(taylor, chunk_grad)
        return from_columns(grad_qk, qk.shape), None, grad_words, None, None


def ray_rotation_grads(rays: Rays, pos: torch.Tensor, words: torch.Tensor, gains: torch.Tensor,
                       grad_rot: torch.Tensor, grad_vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`GeneratorRotation`'s backward along :class:`Rays`: the gradients of the queries and keys (K * T * G, b,
    2B) and of the words, from the rotations' (``grad_rot``, (K * T * G, b, b)) and the rotated vectors'. The primitive
    points' squarings are made once and kept, the exponentials and every multiple taken from them."""
    heads, blocks, _, b, _ = words.shape
    taylor = TaylorPolynomials.of(rays.primitives(pos), words, gains)
    chunks = kept_squarings(taylor)
    exp = torch.empty_like(taylor.polynomials)
    for index, powers, counts in chunks:
        exp.index_copy_(0, index, each_exponential(powers, counts))
    table = rays.table(exp, heads, blocks)
    del exp
    grad_qk = torch.bmm(rays.tokens(table).reshape(-1, b, b).mT, grad_vectors)
    per_token = grad_rot.view(heads, -1, blocks, b, b).transpose(0, 1)  # (T, K, G, b, b)
    grad_exp = rays.table_grad(table, torch.zeros_like(table).index_add_(0, rays.take, per_token))
    return grad_qk, exp_backward(taylor, lambda index, powers, counts: grad_exp.index_select(0, index), chunks)


def as_columns(qk: torch.Tensor, b: int) -> torch.Tensor:
    """(2, B, H, T, G*b) -> (H * T * G, b, 2 * B): each rotation block's vectors, side by side."""
    two, batch, heads, tokens, span = qk.shape
    return qk.reshape(two, batch, heads, tokens, span // b, b).permute(2, 3, 4, 5, 0, 1).reshape(-1, b, two * batch)


def from_columns(columns: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """:func:`as_columns`' inverse: (H * T * G, b, 2 * B) -> ``shape`` (2, B, H, T, G*b)."""
    two, batch, heads, tokens, span = shape
    b = columns.shape[1]
    blocks = columns.view(heads, tokens, span // b, b, two, batch).permute(4, 5, 0, 1, 2, 3)
    return blocks.reshape(shape)


def token_blocks(coords: torch.Tensor, size: int) -> list[slice] | list[torch.Tensor]:
    """Blocks of about ``size`` of the tokens of ``coords`` ((T, p), or (B, T, p) per sample) for a large grid's
    rotations: on CPU whole rays from the origin (each block's tokens in one index tensor), so that a block's
    rotations share their rays' exponentials (:class:`Rays`), where the coordinates are whole; else runs of tokens."""
    tokens = coords.shape[-2]
    rays = ray_of_tokens(coords) if coords.device.type == "cpu" and not torch.compiler.is_compiling() else None
    if rays is None:
        return [slice(start, start + size) for start in range(0, tokens, size)]
    order = torch.argsort(rays[0], stable=True)  # tokens by ray
    bounds, taken = [0], 0
    for count in torch.bincount(rays[0]).tolist():  # a block ends at the first ray end past ``size`` tokens
        taken += count
        if taken - bounds[-1] >= size:
            bounds.append(taken)
    if bounds[-1] < tokens:
        bounds.append(tokens)
    return [order[start:stop] for start, stop in zip(bounds, bounds[1:])]


def distinct_coordinates(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, p) per-sample coordinates -> the distinct ones (D, p) and each token's index among them (B, T)."""
    distinct, index = torch.unique(coords.reshape(-1, coords.shape[-1]), dim=0, return_inverse=True)
    return distinct, index.view(coords.shape[:2])


def take_rotations(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Each token's rotation from the distinct coordinates' ``table`` (..., H, D, G, b, b), by ``index`` (B, s):
    (..., B, H, s, G, b, b)."""
    return table.index_select(-4, index.reshape(-1)).unflatten(-4, index.shape).movedim(-5, -6)


def grid_slots(index: torch.Tensor, on_grid: torch.Tensor, cells: int) -> torch.Tensor | None:
    """(B, T) each token's slot on a rectangle of ``cells`` cells (``index``: its cell) for
    :meth:`LieRE.rotate_on_cells`: its cell, or the spare slot ``cells`` off the grid (``on_grid`` False: a prefix
    token, padding). None where the rectangle holds more than :data:`CELL_GRID_RATIO` times a sample's tokens on it,
    or where two of a sample's tokens share a cell (a packed row, repeated coordinates)."""
    if cells > CELL_GRID_RATIO * max(1, int(on_grid.sum(-1).max())):
        return None
    slots = torch.where(on_grid, index, cells)
    return None if bool((cell_counts(slots, cells) > 1).any()) else slots


class CellRotations(NamedTuple):
    """Every layer's rotations of the whole cells of a rectangle that holds a batch's per-sample coordinates (a NaFlex
    batch's patch indices), and each token's cell. Per-token coordinates change with every batch, so they key no
    cache, but their cells do: the cells' rotations are kept across forwards (:meth:`LieRE.cell_rotations`), and each
    layer's tokens gather theirs."""

    tables: tuple[torch.Tensor, ...]  #: per layer (H, cells, G, b, b)
    index: torch.Tensor  #: (B, T) each token's cell
    #: (B, T) :func:`grid_slots` on the batch's own rectangle (``needed`` cells per axis, a corner of the table's
    #: ``extent``), where the batch is rotated on it
    slots: torch.Tensor | None = None
    extent: tuple[int, ...] = ()
    needed: tuple[int, ...] = ()

    def own_rectangle(self, layer: int) -> torch.Tensor:
        """``layer``'s rotations of the cells of the batch's own rectangle, which :attr:`slots` index: (H, cells, G, b,
        b), the table itself, or the corner of it that the batch needs (a copy: the table grows to the largest batch's
        rectangle, and a batch of squares after one of mixed aspect ratios would otherwise be rotated on all of it)."""
        table = self.tables[layer]
        if self.needed == self.extent:
            return table
        corner = table.unflatten(1, self.extent[::-1])[(slice(None), *(slice(0, n) for n in self.needed[::-1]))]
        return corner.flatten(1, len(self.extent))

    def layer(self, layer: int, block: slice = slice(None)) -> torch.Tensor:
        """``layer``'s rotations of the tokens ``block`` of every sample, heads first as the gather makes them:
        (H, B, tokens, G, b, b) (:meth:`LieRE.rotate`'s ``heads_first``)."""
        index = self.index[:, block]
        return self.tables[layer].index_select(1, index.reshape(-1)).unflatten(1, index.shape)


@register_encoding("liere", block_size=None)
@register_encoding("liere8", block_size=8)
class LieRE(PositionEncoding):
    """LieRE with block-diagonal (``block_size``) or dense (``block_size=None``) generators."""

    mechanisms = ("qk",)
    paper = "LieRE (Ostmeier et al. 2025)"

    def __init__(self, ctx: EncodingContext, block_size: int | None = None, init_scale: float = 2 * math.pi) -> None:
        super().__init__(ctx)
        hd = ctx.head_dim
        self.block_size = b = hd if block_size is None else block_size
        if not 2 <= b <= hd:
            raise ValueError(f"LieRE block_size must be in [2, head_dim={hd}], got {b}")
        self.num_blocks = hd // b
        # (depth, heads, blocks, p, b, b) raw parameters; only the strict upper triangle is used
        shape = (ctx.depth, ctx.num_heads, self.num_blocks, ctx.ndim, b, b)
        self.init_scale = init_scale
        self.generators = nn.Parameter(torch.empty(shape))
        self.register_buffer("extent_scale", torch.empty(ctx.ndim))  # 1 / (training grid extent - 1) per axis
        self._cell_extent: tuple[int, ...] = ()  # the largest rectangle of cells a batch has needed (cell_rotations)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Generators ~ U(0, init_scale) (the reference's init); positions scaled by the training grid's extent."""
        self.generators.copy_(torch.rand(self.generators.shape) * self.init_scale)
        grid = torch.tensor(list(reversed(self.ctx.grid_size)), dtype=torch.float32)  # coordinate axis order
        self.extent_scale.copy_(1.0 / (grid - 1).clamp(min=1))

    def rotations(self, coords: torch.Tensor, layer: int | None = None,
                  words: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """(..., T, p) token coordinates ((T, p), or (B, T, p) per sample) -> (depth, ..., heads, T, blocks, b, b)
        rotations, or (..., heads, T, blocks, b, b) for one ``layer``; float32 (float64 for float64 coordinates). A
        token at the origin gets the identity. Per-sample coordinates repeat (a batch of grids shares its cells): each
        distinct coordinate gets one ``matrix_exp``, then every token takes its coordinate's rotation. ``words``: the
        layer's :meth:`layer_words` on CPU, where a caller rotates its tokens a block at a time."""
        if coords.ndim == 3 and not torch.compiler.is_compiling():  # (B, T, p); unique has a data-dependent size
            distinct, index = distinct_coordinates(coords)
            if distinct.shape[0] < index.numel():
                return take_rotations(self.rotations(distinct, layer, words), index)  # (..., B, H, T, G, b, b)
        work = compute_dtype(coords)
        pos = coords.to(work) * self.extent_scale.to(work)
        raw = self.generators if layer is None else self.generators[layer : layer + 1]
        skew = skew_symmetric(raw.to(work))  # (L, H, G, p, b, b)
        if torch.compiler.is_compiling() or pos.device.type != "cpu":
            log_rot = torch.einsum("...np,lhgpij->l...hngij", pos, skew)
            b = self.block_size
            rot = torch.linalg.matrix_exp(log_rot.reshape(-1, b, b)).view(log_rot.shape)  # one flat batch
        else:  # (L * H, B * T, G, b, b) -> (L, ..., H, T, G, b, b); without gradients, rays share exponentials
            rays = Rays.of(coords) if pos.ndim == 2 and not self.trains_generators() else None
            rot = rotation_exp(pos.reshape(-1, pos.shape[-1]), skew.flatten(0, 1), words, rays)
            rot = rot.unflatten(0, skew.shape[:2])
            rot = rot.unflatten(2, pos.shape[:-1]).movedim(2, 1) if pos.ndim == 3 else rot
        return rot if layer is None else rot[0]

    @staticmethod
    def token_coordinates(pos: TokenPositions) -> torch.Tensor:
        """(P+N, p) ((B, P+N, p) per sample): prefix tokens at the origin, whose rotation is the identity (the
        reference's zero generator), so every token is rotated by one einsum with no slicing."""
        return torch.nn.functional.pad(pos.coords, (0, 0, pos.num_prefix_tokens, 0))

    def prepare(self, pos: TokenPositions
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | CellRotations | None]:
        """(token coordinates, each layer's rotations). While gradients flow into the generators the rotations are
        left to :meth:`transform_qk`, one layer at a time: the backward of one all-layer ``matrix_exp`` would hold
        every layer's intermediates at once (over 10 GB for dense LieRE at ViT-B/16). Per-sample whole coordinates
        (NaFlex's patch indices) without gradients take their cells' rotations, kept across forwards
        (:meth:`cell_rotations`)."""
        coords = self.token_coordinates(pos)
        cells = self.cell_rotations(coords, self.on_grid(pos)) if pos.per_sample else None
        if cells is not None:
            return coords, cells
        if self.trains_generators() or torch.compiler.is_compiling() \
                or self.layer_bytes(pos) * self.ctx.depth > CACHE_BYTES:
            # compiled: no Python cache inside a graph (and no graph break, so fullgraph=True holds); each layer's
            # matrix_exp is part of the graph and recomputed per call. Large grids: every layer's rotations would
            # hold more than CACHE_BYTES, so each layer makes its own, a block of tokens at a time
            return coords, None
        return coords, self._cached_rotations(pos)

    @staticmethod
    def on_grid(pos: TokenPositions) -> torch.Tensor:
        """(B, P+N) per-sample positions' tokens that lie on their grid: not a prefix token, not padding."""
        valid = pos.valid if pos.valid is not None else pos.coords.new_ones(pos.coords.shape[:2], dtype=torch.bool)
        return torch.nn.functional.pad(valid, (pos.num_prefix_tokens, 0), value=False)

    def cell_rotations(self, coords: torch.Tensor, on_grid: torch.Tensor | None = None) -> CellRotations | None:
        """Per-sample coordinates (B, T, p) rotated from the whole cells of a rectangle that holds them: every layer's
        rotations of those cells made once and kept across forwards (:meth:`cached`: a parameter change makes them
        again) while they take at most CACHE_BYTES. The rectangle grows to the largest a batch has needed, so that a
        loader's batches share one table. None with gradients (the rotations then carry the generators' graph),
        compiled, over that bound, or where a coordinate is not a whole, non-negative number (free tokens)."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or coords.ndim != 3 or coords.numel() == 0:
            return None
        whole = whole_coordinates(coords)
        if whole is None or bool((whole < 0).any()):
            return None
        needed = tuple(int(v) + 1 for v in whole.flatten(0, 1).amax(0).tolist())  # cells per axis
        itemsize = compute_dtype(coords).itemsize

        def fits(extent: tuple[int, ...]) -> bool:
            return self.rotations_bytes(math.prod(extent), itemsize) * self.ctx.depth <= CACHE_BYTES

        grown = tuple(map(max, needed, self._cell_extent)) if len(self._cell_extent) == len(needed) else needed
        extent = grown if fits(grown) else needed
        if not fits(extent):
            return None
        self._cell_extent = extent
        working = autocast_dtype(coords.device)

        def build() -> tuple[torch.Tensor, ...]:
            with full_precision(coords.device):
                # the rectangle's whole cells (cells, p), the first axis fastest, as cell_index numbers them
                cells = grid_positions(extent[::-1], 0, device=coords.device, dtype=coords.dtype).coords
                tables = [self.rotations(cells, layer) for layer in range(self.ctx.depth)]  # (H, cells, G, b, b)
            return tuple(table.to(working or table.dtype) for table in tables)

        key = (extent, coords.device, coords.dtype, working)
        tables = self.cached(key, build, depends_on_params=True, slot="cells")  # beside a grid's rotations
        # each token's slot on the batch's own rectangle, where it is rotated on it
        slots = grid_slots(cell_index(whole, needed), on_grid, math.prod(needed)) if on_grid is not None else None
        return CellRotations(tables, cell_index(whole, extent), slots, extent, needed)

    def rotate_cells(self, qk: torch.Tensor, coords: torch.Tensor, cells: CellRotations, layer: int) -> torch.Tensor:
        """Queries and keys rotated by their cells' rotations of ``layer`` (no gradients): on the cells' rectangle
        where :func:`grid_slots` allows it and the queries and keys there take at most STATE_BYTES
        (:meth:`rotate_on_cells`); else each token's rotations gathered, at once where they take at most STATE_BYTES,
        else BLOCK_BYTES of them at a time (:meth:`rotate_in_blocks`)."""
        batch, tokens = cells.index.shape
        table = cells.tables[layer]
        own = math.prod(cells.needed)  # the batch's own rectangle's cells
        on_rectangle = math.prod(qk.shape[:3]) * (own + 1) * qk.shape[-1] * table.element_size()
        if cells.slots is not None and on_rectangle <= STATE_BYTES:  # bounded as a layer's rotations at once are
            return self.rotate_on_cells(qk, cells.own_rectangle(layer), cells.slots)
        size = self.rotations_bytes(batch * tokens, table.element_size())
        if size <= STATE_BYTES:
            return self.rotate(qk, cells.layer(layer), heads_first=True)
        blocks = token_blocks(coords, max(1, tokens * BLOCK_BYTES // size))
        return self.rotate_in_blocks(qk, blocks, functools.partial(cells.layer, layer), heads_first=True)

    def rotate_on_cells(self, qk: torch.Tensor, table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Queries and keys (2, B, H, T, hd) scattered onto the cells' rectangle, rotated there as a square batch is
        (each cell's rotation, ``table`` (H, cells, G, b, b), serves every sample) and gathered back (``slots``:
        :func:`grid_slots`). The per-token path gathers each token's own rotations instead, (H, B, T, G, b, b): 4x the
        queries and keys for LieRE-8, and memory is what it moves. Tokens off the grid (prefix, padding) keep their
        values: a prefix token's rotation is the identity, and padding is masked out of attention."""
        two, batch, heads, tokens, dim = qk.shape
        cells = table.shape[1]
        pairs = torch.arange(batch * heads, device=qk.device).view(batch, heads, 1)  # each (sample, head)'s rows
        # (B * H * T,) each token's row on the rectangle, flattened with a spare row per (sample, head) after its cells;
        # rows, not (2, B, H, T, hd) indices: an index as large as q and k cost more than the rotations it saved
        rows = (pairs * (cells + 1) + slots[:, None, :]).flatten()
        grid = qk.new_zeros(two, batch * heads * (cells + 1), dim).index_copy_(1, rows, qk.reshape(two, -1, dim))
        rotated = self.rotate(grid.view(two, batch, heads, cells + 1, dim)[..., :cells, :], table)  # (2, B, H, C, hd)
        back = (pairs * cells + slots.clamp(max=cells - 1)[:, None, :]).flatten()
        out = rotated.reshape(two, -1, dim).index_select(1, back).view(qk.shape)
        sample, token = (slots == cells).nonzero(as_tuple=True)  # off the grid: a few tokens a sample
        out[:, sample, :, token] = qk[:, sample, :, token]
        return out

    def rotate_in_blocks(self, qk: torch.Tensor, blocks: list[slice] | list[torch.Tensor],
                         rotations: Callable[[slice | torch.Tensor], torch.Tensor], heads_first: bool = False
                         ) -> torch.Tensor:
        """Without gradients, ``qk`` rotated a block of tokens at a time, each block's ``rotations(block)`` used and
        written straight into the output: nothing but the output outlives a block."""
        out = torch.empty_like(qk)
        for block in blocks:
            out[..., block, :] = self.rotate(qk[..., block, :], rotations(block), heads_first)
        return out

    def rotations_bytes(self, positions: int, itemsize: int = 4) -> int:
        """What one layer's rotations of ``positions`` token positions take: (positions, H, G, b, b) elements."""
        return itemsize * positions * self.ctx.num_heads * self.num_blocks * self.block_size**2

    def layer_bytes(self, pos: TokenPositions) -> int:
        """What one layer's rotations take: (B', H, P+N, G, b, b) float32."""
        batch = pos.coords.shape[0] if pos.per_sample else 1
        return self.rotations_bytes(batch * (pos.num_patches + pos.num_prefix_tokens))

    def _cached_rotations(self, pos: TokenPositions) -> tuple[torch.Tensor, ...]:
        """Computed in float32 one layer at a time (matrix_exp's temporaries for every layer at once need ~10x the
        result: over 20 GB for dense LieRE at ViT-B/16, 448 px), kept in the dtype q and k have under autocast
        (its matmul would cast them to it in every layer anyway)."""
        device = pos.coords.device
        working = autocast_dtype(device)

        def build() -> tuple[torch.Tensor, ...]:
            with full_precision(device):
                coords = self.token_coordinates(pos)
                rotations = [self.rotations(coords, layer) for layer in range(self.ctx.depth)]
            return tuple(rot.to(working or rot.dtype) for rot in rotations)

        key = pos.cache_key()  # None for per-token coordinates: built for every batch, never kept
        return self.cached(key and (key, working), build, depends_on_params=True)

    def rotate(self, qk: torch.Tensor, rot: torch.Tensor, heads_first: bool = False) -> torch.Tensor:
        """qk: (2, B, H, P+N, hd); rot: (H, P+N, G, b, b), or (B, H, P+N, G, b, b) per sample (``heads_first``:
        (H, B, P+N, G, b, b), as a gather from a table of cells makes them). Rotates the first G*b dims of every token,
        in the rotations' precision (float32; under autocast, its dtype)."""
        span = self.num_blocks * self.block_size
        work = qk if autocast_dtype(qk.device) is not None else qk.to(rot.dtype)
        blocks = work[..., :span].unflatten(-1, (self.num_blocks, self.block_size))  # (2, B, H, T, G, b)
        if rot.ndim == 5:
            rotated = torch.einsum("htgij,sbhtgj->sbhtgi", rot, blocks).flatten(-2)
        elif heads_first:  # one product over (H, B, T, G) that reads the rotations in place: einsum would copy them
            # into its own batch order, a (B, H, T, G, b, b) copy of every token's rotations (dense LieRE's NaFlex
            # forward at ViT-S/16: 0.21 s of 0.95 s in copies)
            rows = blocks.permute(2, 1, 3, 4, 0, 5).contiguous()  # (H, B, T, G, 2, b): q and k as two rows
            b = self.block_size  # (R v)^T = v^T R^T: two rows against each matrix run 5x faster than two columns
            products = torch.bmm(rows.view(-1, 2, b), rot.reshape(-1, b, b).mT).view(rows.shape)
            rotated = products.permute(4, 1, 0, 2, 3, 5).flatten(-2)  # (2, B, H, T, G * b)
        else:  # each sample's own rotations
            rotated = torch.einsum("bhtgij,sbhtgj->sbhtgi", rot, blocks).flatten(-2)
        if span < qk.shape[-1]:  # head dims beyond the last full block stay as they are
            rotated = torch.cat([rotated, work[..., span:]], dim=-1)
        return rotated.to(qk.dtype)

    def transform_qk(self, layer: int, qk: torch.Tensor, x: torch.Tensor, state: Any) -> torch.Tensor:
        coords, all_layers = state
        if isinstance(all_layers, CellRotations):
            return self.rotate_cells(qk, coords, all_layers, layer)
        if all_layers is not None:
            return self.rotate(qk, all_layers[layer])
        tokens = coords.shape[-2]
        size = self.rotations_bytes((coords.shape[0] if coords.ndim == 3 else 1) * tokens)
        if torch.compiler.is_compiling():  # one graph: the layer's rotations at once
            return self.rotate_block(qk, coords, layer)
        if size <= STATE_BYTES:  # the layer's rotations at once. In training on CPU autograd keeps them, with their
            # generator sums (rotation_exp's) and the unrotated queries and keys, a few times STATE_BYTES a layer at
            # most: recomputed in backward instead (checkpointed), each step made the exponentials a third time
            # (LieRE-8 at ViT-S/16, 448 px, batch 4, fresh processes alternated: 4.65-4.68 s and 1.61 GB resident
            # kept, 4.91-5.11 s and 1.36 GB checkpointed; `ape` about 3.2 s and 1.0 GB: the lines are 1.5x
            # its time and 2x its memory). Elsewhere torch's matrix_exp keeps several times the rotations for its
            # backward (2.2x a plain ViT's training memory): checkpointed. GeneratorRotation here (no rotation kept,
            # made again in backward) took LieRE-8's step there to 8.0 s from 6.0-6.2 s: a layer's 8x8 blocks at once
            if self.trains_generators() and coords.device.type != "cpu":
                return checkpoint(self.rotate_block, qk, coords, layer, use_reentrant=False)
            return self.rotate_block(qk, coords, layer)
        # a large grid: the rotations of a block of tokens, used and dropped; in training each block's are made again
        # in backward, so the exponentials' intermediates never cover every token
        if not torch.is_grad_enabled():
            with full_precision(coords.device):
                rotations, block_bytes = self.block_rotations(coords, layer)
                return self.rotate_in_blocks(qk, token_blocks(coords, max(1, tokens * block_bytes // size)), rotations)
        words = self.layer_words(layer, compute_dtype(coords)) if self.by_hand(coords) else None  # once a layer
        step = max(1, tokens * BLOCK_BYTES // size)
        blocks = token_blocks(coords, step)
        order = torch.cat(blocks) if isinstance(blocks[0], torch.Tensor) else None  # whole rays: tokens by ray
        sizes = step if order is None else [len(block) for block in blocks]  # runs of ``step`` tokens, or the rays'
        parts = (qk if order is None else qk.index_select(-2, order)).split(sizes, dim=-2)  # one gather: one scatter
        sorted_coords = (coords if order is None else coords[order]).split(sizes, dim=-2)  # back in backward
        rotated = []
        for part, block in zip(parts, sorted_coords):
            if words is not None:  # one grid on CPU: GeneratorRotation makes the exponentials once in backward,
                # checkpointing twice (dense LieRE at ViT-S/16, 448 px, batch 4, fresh processes alternated:
                # 20.1-20.2 s a step against 22.6-22.7 s; LieRE-8 forced blockwise there 5.9-6.1 s against 6.2-6.6 s)
                rotated.append(self.rotate_by_hand(part, block, words))
            else:  # per-sample coordinates (their distinct ones, per block), a GPU's matrix_exp, autocast
                rotated.append(checkpoint(self.rotate_block, part, block, layer, use_reentrant=False))
        out = torch.cat(rotated, dim=-2)
        return out if order is None else out.index_select(-2, torch.argsort(order))  # back to the tokens' order

    def block_rotations(self, coords: torch.Tensor, layer: int
                        ) -> tuple[Callable[[slice | torch.Tensor], torch.Tensor], int]:
        """The rotations of ``layer`` for a block of tokens (:func:`token_blocks`; :meth:`rotations`' shapes), and the
        bytes of rotations a block takes without gradients. Per-sample coordinates (B, T, p) take each distinct
        coordinate's rotation from one table made for the layer, where it fits in STATE_BYTES: a batch of grids shares
        its cells, but a block of tokens shares few of them, so blocks that each took their own distinct coordinates
        ran many more ``matrix_exp`` (dense LieRE, a NaFlex batch at ViT-S/16: 3.9 s a forward in 1 MB blocks, 2.3 s
        in 4 MB blocks; docs/speed.md). The table's rays share exponentials (:class:`Rays`), as a grid's blocks'. A
        table's blocks only gather, so they take BLOCK_BYTES; blocks that make their own rotations take
        INFERENCE_BLOCK_BYTES on CPU (matrix_exp's temporaries)."""
        if coords.ndim == 3:
            distinct, index = distinct_coordinates(coords)
            table_bytes = self.rotations_bytes(distinct.shape[0], compute_dtype(coords).itemsize)
            if table_bytes <= STATE_BYTES:  # the bound of a layer's rotations made at once
                table = self.rotations(distinct, layer)  # (H, distinct, G, b, b)
                return (lambda block: take_rotations(table, index[:, block])), BLOCK_BYTES
        if coords.device.type != "cpu" or torch.compiler.is_compiling():  # torch's matrix_exp; a GPU's launches count
            return (lambda block: self.rotations(coords[..., block, :], layer)), BLOCK_BYTES
        words = self.layer_words(layer, compute_dtype(coords))  # once a layer, not a block (a 1 MB block of dense
        # LieRE at ViT-B/16 is 5 tokens: making the words for each took 448 px inference from 7.1 s to 46.6 s)
        return (lambda block: self.rotations(coords[..., block, :], layer, words)), INFERENCE_BLOCK_BYTES

    def rotate_block(self, qk: torch.Tensor, coords: torch.Tensor, layer: int) -> torch.Tensor:
        """Queries and keys of a block of tokens rotated by that block's rotations of ``layer``."""
        with full_precision(coords.device):
            return self.rotate(qk, self.rotations(coords, layer))

    def trains_generators(self) -> bool:
        """Whether autograd takes the generators' gradient through this call's rotations."""
        return differentiated(self.generators)

    @staticmethod
    def by_hand(coords: torch.Tensor) -> bool:
        """Whether :meth:`rotate_by_hand` takes a layer's rotations in training: one grid's coordinates (T, p), on CPU
        without autocast (a GPU's and autocast's path is torch's matrix_exp)."""
        return coords.ndim == 2 and coords.device.type == "cpu" and autocast_dtype(coords.device) is None

    def layer_words(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`normalised_words` of ``layer``'s skew generators, in ``dtype``: what every block of its tokens
        shares on CPU (:meth:`rotate_by_hand` in training, :meth:`block_rotations` without gradients)."""
        return normalised_words(skew_symmetric(self.generators[layer].to(dtype)))  # (H, G, p, b, b)

    def rotate_by_hand(self, qk: torch.Tensor, coords: torch.Tensor, words: tuple[torch.Tensor, torch.Tensor]
                       ) -> torch.Tensor:
        """:meth:`rotate_block` through :class:`GeneratorRotation` (coordinates (T, p) shared by the batch, CPU),
        with the layer's :meth:`layer_words`; tokens that share a ray from the origin share its exponential."""
        gains, taylor_words = words
        pos = coords.to(gains.dtype) * self.extent_scale.to(gains.dtype)
        span = self.num_blocks * self.block_size
        rotated = GeneratorRotation.apply(qk[..., :span].to(gains.dtype), pos, taylor_words, gains, Rays.of(coords))
        if span < qk.shape[-1]:  # head dims beyond the last full block stay as they are
            rotated = torch.cat([rotated, qk[..., span:].to(gains.dtype)], dim=-1)
        return rotated.to(qk.dtype)

    def no_weight_decay(self) -> set[str]:
        return {"generators"}
