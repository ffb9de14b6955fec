"""Mathematical properties of every encoding, in float64 on random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    DIM,
    HEAD_DIM,
    HEADS,
    attention,
    free_positions,
    logits,
    make_encoding,
    random_coords,
    random_qkx,
    rotation_2d,
    transform,
)
from timm.layers import resample_abs_pos_embed

import pape_hub.encodings.liere as liere
from pape_hub.encodings import EncodingContext, TokenPositions, create_encoding, grid_positions, list_encodings
from pape_hub.encodings.alibi import alibi_slopes, assign_head_views, split_heads
from pape_hub.encodings.liere import LieRE
from pape_hub.encodings.pape import quadratic_query_coefficients

N = 12  # patch tokens in the free-form tests

# (encoding, kwargs) whose attention depends on relative position only
RELATIVE = [
    ("rope", {}), ("rope_mixed", {}), ("alibi", {}), ("lookhere", {}), ("pape", {"num_parabolas": 7}),
    ("pape_ri", {}), ("liere", {"block_size": 2}),
]


@pytest.mark.parametrize("num_prefix", [0, 1])
@pytest.mark.parametrize(("name", "kwargs"), RELATIVE, ids=[n for n, _ in RELATIVE])
def test_translation_invariance(name, kwargs, num_prefix):
    """Shift every position: patch-to-patch logits are unchanged. With a CLS token, the whole attention is
    unchanged where CLS has no position (bias methods) or moves with the grid (PaPE); rotary methods leave CLS
    unrotated, which ties its logits to absolute positions, exactly as in their reference code."""
    enc = make_encoding(name, num_prefix=num_prefix, **kwargs)
    coords = random_coords(N)
    q, k, x = random_qkx(num_prefix + N)
    shift = torch.tensor([3.7, -11.2], dtype=torch.float64)
    cls_free = name in ("alibi", "lookhere", "pape", "pape_ri")
    for layer in range(enc.ctx.depth):
        before = logits(enc, free_positions(coords, num_prefix), q, k, x, layer)
        after = logits(enc, free_positions(coords + shift, num_prefix), q, k, x, layer)
        p = num_prefix
        torch.testing.assert_close(after[..., p:, p:], before[..., p:, p:], rtol=1e-9, atol=1e-10)
        if num_prefix == 0 or cls_free:
            torch.testing.assert_close(after.softmax(-1), before.softmax(-1), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["pape_ri", "alibi"])
def test_rotation_invariance(name):
    enc = make_encoding(name, num_prefix=0)
    coords = random_coords(N)
    q, k, x = random_qkx(N)
    rotated = coords @ rotation_2d(1.234).T + torch.tensor([2.0, -1.0], dtype=torch.float64)
    before = attention(enc, free_positions(coords, 0), q, k, x)
    after = attention(enc, free_positions(rotated, 0), q, k, x)
    torch.testing.assert_close(after, before, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name", ["pape", "lookhere", "rope"])
def test_directional_encodings_are_not_rotation_invariant(name):
    enc = make_encoding(name, num_prefix=0)
    coords = random_coords(N)
    q, k, x = random_qkx(N)
    before = attention(enc, free_positions(coords, 0), q, k, x)
    after = attention(enc, free_positions(coords @ rotation_2d(1.234).T, 0), q, k, x)
    assert (after - before).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["rope", "rope_mixed"])
def test_rope_scores_depend_on_offset_only(name):
    """The same q and k vectors at (a, b) and at (a + t, b + t) give the same score, for every head/layer."""
    enc = make_encoding(name, num_prefix=0)
    q, k, x = random_qkx(1)
    a, b = torch.tensor([[1.5, -2.0]], dtype=torch.float64), torch.tensor([[4.0, 0.5]], dtype=torch.float64)
    t = torch.tensor([[-7.3, 2.9]], dtype=torch.float64)
    for layer in range(enc.ctx.depth):
        def score(pq, pk, layer=layer):
            coords = torch.cat([pq, pk])
            qq, kk = torch.cat([q, q], 2), torch.cat([k, k], 2)
            qr, kr = transform(enc, layer, qq, kk, torch.cat([x, x], 1), enc.prepare(free_positions(coords, 0)))
            return (qr[:, :, 0] * kr[:, :, 1]).sum(-1)

        torch.testing.assert_close(score(a + t, b + t), score(a, b), rtol=1e-10, atol=1e-10)
        assert (score(a, b) - score(a, b + t)).abs().max() > 1e-6


@pytest.mark.parametrize("name", ["rope_ape", "rope_mixed_ape"])
def test_rope_with_a_table_is_rope_plus_a_learned_table_of_the_patch_cells(name):
    """Naver's RoPE + APE: queries and keys rotate exactly as the plain encoding's; the tokens get a learned table
    of the patch cells (CLS nothing), resampled bicubically at other grids as timm does a table without a CLS row."""
    plain, enc = make_encoding(name.removesuffix("_ape")), make_encoding(name)
    assert enc.mechanisms == ("tokens", "qk") and plain.mechanisms == ("qk",)
    assert set(enc.state_dict()) == set(plain.state_dict()) | {"absolute.pos_embed"}
    plain.load_state_dict({k: v for k, v in enc.state_dict().items() if not k.startswith("absolute.")})
    q, k, x = random_qkx(1 + 20)
    pos = grid_positions((4, 5), 1, dtype=torch.float64)
    for layer in range(enc.ctx.depth):
        for a, b in zip(transform(enc, layer, q, k, x, enc.prepare(pos)),
                        transform(plain, layer, q, k, x, plain.prepare(pos))):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    table = enc.absolute.pos_embed  # (1, 20, D): cells only
    assert table.shape == (1, 20, DIM)
    added = enc.add_to_tokens(x, pos) - x
    torch.testing.assert_close(added[:, 0], torch.zeros_like(added[:, 0]))
    torch.testing.assert_close(added[:, 1:], table.expand(2, -1, -1))
    bigger = grid_positions((6, 7), 1, dtype=torch.float64)
    x_big = torch.zeros(1, 1 + 42, DIM, dtype=torch.float64)
    expected = resample_abs_pos_embed(table, new_size=[6, 7], old_size=[4, 5], num_prefix_tokens=0)
    torch.testing.assert_close(enc.add_to_tokens(x_big, bigger)[:, 1:], expected)


def test_polar_rope_scores_depend_on_polar_offsets_only():
    enc = make_encoding("polar_rope", num_prefix=0)
    q, k, x = random_qkx(1)
    corners = torch.tensor([[-9.0, -9.0], [9.0, -9.0], [-9.0, 9.0], [9.0, 9.0]], dtype=torch.float64)  # centre 0

    def at(r, theta):
        return torch.tensor([[r * math.cos(theta), r * math.sin(theta)]], dtype=torch.float64)

    def score(pq, pk):
        coords = torch.cat([pq, pk, corners])
        qq, kk = q.expand(-1, -1, 6, -1), k.expand(-1, -1, 6, -1)
        qr, kr = transform(enc, 0, qq, kk, x.expand(-1, 6, -1), enc.prepare(free_positions(coords, 0)))
        return (qr[:, :, 0] * kr[:, :, 1]).sum(-1)

    same_offsets = score(at(1.0, 0.3), at(2.0, 1.0)), score(at(2.5, -0.5), at(3.5, 0.2))  # dr = 1, dtheta = 0.7
    torch.testing.assert_close(*same_offsets, rtol=1e-10, atol=1e-10)
    assert (score(at(1.0, 0.3), at(2.0, 1.0)) - score(at(1.0, 0.3), at(2.0, 1.5))).abs().max() > 1e-6


def test_polar_rope_is_rotation_invariant_away_from_the_branch_cut():
    """Scores depend on (dr, dtheta) about the centre, so turning the board about its centre changes nothing
    for pairs whose angles do not straddle atan2's cut at +-pi: why Polar RoPE, like the isotropic biases,
    cannot tell a quarter-turned motion clip from the original (README, video results)."""
    enc = make_encoding("polar_rope", num_prefix=0)
    corners = torch.tensor([[-9.0, -9.0], [9.0, -9.0], [-9.0, 9.0], [9.0, 9.0]], dtype=torch.float64)  # centre 0
    g = torch.Generator().manual_seed(3)
    r = 1 + 7 * torch.rand(N, generator=g, dtype=torch.float64)
    theta = 0.1 + 1.3 * torch.rand(N, generator=g, dtype=torch.float64)  # first quadrant, turned into the second
    points = torch.stack([r * theta.cos(), r * theta.sin()], -1)
    q, k, x = random_qkx(N + 4)
    before = logits(enc, free_positions(torch.cat([points, corners]), 0), q, k, x)
    for angle in (math.pi / 2, 1.0):  # the corners stay symmetric about 0, so the centre does not move
        turn = rotation_2d(angle)
        after = logits(enc, free_positions(torch.cat([points, corners]) @ turn.T, 0), q, k, x)
        torch.testing.assert_close(after[..., :N, :N], before[..., :N, :N], rtol=1e-9, atol=1e-10)


def test_rotation_tables_rotate_pairs_and_leave_prefix_tokens():
    from pape_hub.encodings.rotary import rotate_pairs, rotation_tables

    phases = torch.rand(3, 2, dtype=torch.float64) * 6  # 3 tokens, 2 pairs
    cos, sin = rotation_tables(phases, num_prefix=1)
    x = torch.randn(4, 4, dtype=torch.float64)  # prefix token + 3 tokens, head dim 4
    out = rotate_pairs(x, cos, sin)
    torch.testing.assert_close(out[0], x[0])  # the prefix token is not rotated
    for t in range(3):
        for k in range(2):
            c, s_ = math.cos(phases[t, k]), math.sin(phases[t, k])
            x1, x2 = x[1 + t, 2 * k], x[1 + t, 2 * k + 1]
            torch.testing.assert_close(out[1 + t, 2 * k: 2 * k + 2], torch.stack([x1 * c - x2 * s_, x1 * s_ + x2 * c]))


def test_polar_rope_layout():
    """First half of each head rotated by r, second half by theta, about the grid centre."""
    enc = make_encoding("polar_rope", grid=(3, 3), num_prefix=0)
    pos = grid_positions((3, 3), 0, dtype=torch.float64)
    cos, sin = enc.prepare(pos)  # full width: cos per pair, sin signed (-sin, +sin) per pair
    phases = torch.atan2(sin[..., 1::2], cos[..., ::2])[0, 0, 0]  # (L, B', H, N, hd/2) -> (N, hd/2)
    centre = 4  # the middle of a 3x3 grid: r = 0 and theta = atan2(0, 0) = 0
    assert torch.allclose(phases[centre], torch.zeros_like(phases[centre]))
    right = 5  # (x=2, y=1): r = 1, theta = 0 -> only the radial half turns, its first pair by exactly 1 rad
    assert phases[right, 0].item() == pytest.approx(1.0)
    assert torch.allclose(phases[right, HEAD_DIM // 4:], torch.zeros(HEAD_DIM // 4, dtype=torch.float64))
    below = 7  # (x=1, y=2): theta = +pi/2 (y grows downwards)
    assert phases[below, HEAD_DIM // 4].item() == pytest.approx(math.pi / 2)


@pytest.mark.parametrize("num_prefix", [0, 1])
@pytest.mark.parametrize("interpolate", [False, True])
@pytest.mark.parametrize("name", ["pape", "pape_ri"])
def test_fused_pape_equals_pairwise_eq9(name, num_prefix, interpolate):
    """softmax of the augmented q.k equals softmax of the paper's eq. 9 (query-only terms cancel)."""
    enc = make_encoding(name, grid=(4, 5), num_prefix=num_prefix)
    pos = grid_positions((6, 7), num_prefix, train_grid_size=(4, 5), interpolate=interpolate, dtype=torch.float64)
    q, k, x = random_qkx(num_prefix + pos.num_patches)
    for layer in range(enc.ctx.depth):
        fused = attention(enc, pos, q, k, x, layer)
        pairwise = (enc.pairwise_scores(layer, q, k, x, pos) * HEAD_DIM**-0.5).softmax(-1)
        torch.testing.assert_close(fused, pairwise, rtol=1e-9, atol=1e-12)


def test_pape_fused_width_does_not_depend_on_m():
    for m, p, extra in [(50, 2, 5), (8, 2, 5), (50, 3, 9)]:
        grid = (3, 4) if p == 2 else (2, 3, 4)
        enc = make_encoding("pape", grid=grid, num_prefix=1, num_parabolas=m)
        pos = grid_positions(grid, 1, dtype=torch.float64)
        q, k, x = random_qkx(1 + pos.num_patches)
        q2, k2 = transform(enc, 0, q, k, x, enc.prepare(pos))
        assert q2.shape[-1] == k2.shape[-1] == HEAD_DIM + extra  # on CPU: no padding
        assert enc.padding(torch.device("cuda")) == -(HEAD_DIM + extra) % 8  # on a GPU: a multiple of 8


def test_pape_padding_for_gpu_kernels_adds_zero_channels_only(monkeypatch):
    for name in ("pape", "pape_ri"):
        enc = make_encoding(name, num_prefix=1)
        pos = grid_positions((4, 5), 1, dtype=torch.float64)
        q, k, x = random_qkx(1 + pos.num_patches)
        plain = logits(enc, pos, q, k, x)
        monkeypatch.setattr(type(enc), "padding", lambda self, device: 3)  # as a GPU would pad
        enc._cache = {}
        q2, k2 = transform(enc, 0, q, k, x, enc.prepare(pos))
        assert q2.shape[-1] == HEAD_DIM + enc.channels + 3 and (q2[..., -3:] == 0).all() and (k2[..., -3:] == 0).all()
        torch.testing.assert_close(logits(enc, pos, q, k, x), plain, rtol=1e-12, atol=1e-12)
        monkeypatch.undo()


def test_pape_curvature_is_concave_and_the_folded_channels_match_the_written_out_form():
    enc = make_encoding("pape", num_prefix=1)
    pos = grid_positions((4, 5), 1, dtype=torch.float64)
    q, k, x = random_qkx(1 + pos.num_patches)
    state = enc.prepare(pos)
    for layer in range(enc.ctx.depth):
        quad, lin = enc.coefficients(layer, x, state["r"][0])  # r: (B', T, p), one grid for the batch
        assert (torch.linalg.eigvalsh(quad) <= 1e-12).all()  # W_p^T diag(a) W_p with a < 0: negative semi-definite
        folded = enc.query_channels(layer, x, state)[..., : enc.channels]  # the forward's once-per-forward form
        torch.testing.assert_close(folded, quadratic_query_coefficients(quad, lin), rtol=1e-10, atol=1e-12)


def test_pape_cls_sits_one_step_before_the_first_patch():
    enc = make_encoding("pape", grid=(3, 3), num_prefix=1)
    r = enc.token_positions(grid_positions((3, 3), 1, dtype=torch.float64))
    # reference: patches at 1..3, CLS at 0; after centring on the patch centre (2, 2)
    torch.testing.assert_close(r[0], torch.tensor([-2.0, -2.0], dtype=torch.float64))
    torch.testing.assert_close(r[1], torch.tensor([-1.0, -1.0], dtype=torch.float64))


def test_liere_rotations_are_orthogonal_per_layer():
    for block in (None, 8, 2):
        enc = make_encoding("liere", block_size=block)
        rot = enc.rotations(random_coords(N))  # (L, H, N, G, b, b)
        eye = torch.eye(rot.shape[-1], dtype=torch.float64)
        torch.testing.assert_close(rot.transpose(-1, -2) @ rot, eye.expand_as(rot), rtol=0, atol=1e-10)
        torch.testing.assert_close(torch.linalg.det(rot), torch.ones(rot.shape[:-2], dtype=torch.float64))
        assert (rot[0] - rot[1]).abs().max() > 1e-3, "each layer must use its own generators"


@pytest.mark.parametrize("block", [8, 64])
def test_liere_rotation_exp_is_torchs_matrix_exp_and_its_gradient(block, monkeypatch):
    """LieRE's exponential on CPU (each generator sum scaled by its own power of two, the Taylor polynomial summed over
    the generators' words, squarings sorted and in chunks; the backward by hand, each chunk made again) equals
    ``torch.linalg.matrix_exp`` in float64, values and the generators' gradient, over norms from 0 (CLS) to a 448 px
    grid's and generators of both blocks' sizes, and the chunks do not change a matrix's exponential; in float32 it is
    within twice torch's own error against the float64 exponential. The control: without the scaling (a Taylor
    polynomial alone) it is far off on the same large norms."""
    torch.manual_seed(0)
    raw = torch.rand(3, 2, 2, block, block, dtype=torch.float64) * 2 * math.pi  # the reference's init
    skew = liere.skew_symmetric(raw).requires_grad_()  # (heads 3, blocks 2, p 2, b, b)
    pos = torch.cat([torch.zeros(1, 2, dtype=torch.float64), torch.rand(40, 2, dtype=torch.float64) * 2.1])
    log_rot = torch.einsum("tp,hgpij->htgij", pos, skew).contiguous()  # (3, 41, 2, b, b)
    theirs = torch.linalg.matrix_exp(log_rot)
    ours = liere.rotation_exp(pos, skew)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-11)
    weights = torch.randn_like(theirs)
    grad_ours, = torch.autograd.grad((ours * weights).sum(), skew)
    grad_theirs, = torch.autograd.grad((theirs * weights).sum(), skew)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-10, atol=1e-10)
    monkeypatch.setattr(liere, "EXP_CHUNK_BYTES", 8 * 16 * block**2)  # chunks of 16 matrices: several, and a short one
    assert torch.equal(liere.rotation_exp(pos, skew.detach()), ours.detach())
    single = liere.rotation_exp(pos.float(), skew.detach().float())
    error = (single.double() - theirs).abs().max()
    assert error <= 2 * (torch.linalg.matrix_exp(log_rot.detach().float()).double() - theirs).abs().max()
    monkeypatch.setitem(liere.TAYLOR_THETA, torch.float64, math.inf)  # control: no scaling, no squaring
    assert (liere.rotation_exp(pos, skew.detach()) - theirs).abs().max() > 1.0


@pytest.mark.parametrize("block", [8, 64])
def test_liere_rays_take_each_multiple_from_the_one_before(block, monkeypatch):
    """Without gradients LieRE's tokens that share a ray from the origin share its exponential: R(g p') = R((g - 1) p')
    R(p') for the ray's primitive point p', exact because one ray's generator sums commute. On a 448 px grid (28 x 28
    from the origin; 3-D coordinates with negative ones too, and multiples whose points before them are missing) it
    equals ``torch.linalg.matrix_exp`` in float64 as the per-token exponential does, and makes a Taylor polynomial
    only for each ray's primitive point. The control: the same products from rays drawn from another origin (one grid
    step off) are far off, as LieRE's rotations are not relative; and coordinates that are not whole have no rays."""
    torch.manual_seed(0)
    grid = torch.cartesian_prod(torch.arange(28.0), torch.arange(28.0)).double()
    points = torch.randint(-6, 7, (30, 3))
    scattered = torch.cat([points, 2 * points[:10], 3 * points[:5], torch.tensor([[6, -9, 3], [-10, 15, 5]])]).double()
    made = []
    polynomials = liere.TaylorPolynomials.of
    monkeypatch.setattr(liere.TaylorPolynomials, "of", lambda pos, *a: made.append(len(pos)) or polynomials(pos, *a))
    for coords in (grid, scattered):
        raw = torch.rand(2, 64 // block, coords.shape[1], block, block, dtype=torch.float64) * 2 * math.pi
        skew = liere.skew_symmetric(raw)  # the reference's init, (heads 2, blocks, p, b, b)
        pos = coords / 13  # a 14 x 14 training grid's spacing
        theirs = torch.linalg.matrix_exp(torch.einsum("tp,hgpij->htgij", pos, skew).contiguous())
        rays = liere.Rays.of(coords)
        made.clear()
        torch.testing.assert_close(liere.rotation_exp(pos, skew, rays=rays), theirs, rtol=0, atol=1e-11)
        assert made == [len(rays.first)] and len(rays.first) < 0.7 * len(coords)
        if coords is grid:
            shifted = liere.Rays.of(coords + 1)
            assert (liere.rotation_exp(pos, skew, rays=shifted) - theirs).abs().max() > 1e-3
    assert liere.Rays.of(grid + 0.5) is None and liere.Rays.of(torch.tensor([[1.0, 2.0], [2.0, 3.0]])) is None


def test_liere_block2_is_relative_and_dense_is_not():
    coords = random_coords(2)
    pi, pj = coords[:1], coords[1:]
    for block, relative in [(2, True), (None, False)]:
        enc = make_encoding("liere", block_size=block)
        r_i, r_j, r_diff = (enc.rotations(c) for c in (pi, pj, pj - pi))
        composed = r_i.transpose(-1, -2) @ r_j  # R(p_i)^T R(p_j)
        error = (composed - r_diff).abs().max().item()
        assert (error < 1e-10) if relative else (error > 1e-3)


def test_liere_scales_positions_to_unit_training_grid():
    enc = make_encoding("liere", grid=(5, 9))
    torch.testing.assert_close(enc.extent_scale, torch.tensor([1 / 8, 1 / 4], dtype=torch.float64))


@pytest.mark.parametrize("name", ["rope", "rope_mixed", "polar_rope", "liere8", "liere", "pape", "pape_ri"])
def test_qk_methods_leave_cls_unrotated_or_documented(name):
    enc = make_encoding(name, num_prefix=1)
    pos = grid_positions((4, 5), 1, dtype=torch.float64)
    q, k, x = random_qkx(1 + pos.num_patches)
    q2, k2 = transform(enc, 0, q, k, x, enc.prepare(pos))
    torch.testing.assert_close(q2[:, :, 0, :HEAD_DIM], q[:, :, 0])  # CLS content channels untouched
    torch.testing.assert_close(k2[:, :, 0, :HEAD_DIM], k[:, :, 0])
    if name not in ("pape", "pape_ri"):  # PaPE moves patches only through the extra channels too
        assert (q2[:, :, 1:] - q[:, :, 1:]).abs().max() > 1e-6


@pytest.mark.parametrize("name", ["alibi", "lookhere", "sape2"])
def test_bias_methods_give_cls_a_zero_row_and_column(name):
    enc = make_encoding(name, num_prefix=1)
    pos = grid_positions((4, 5), 1, dtype=torch.float64)
    q, k, x = random_qkx(1 + pos.num_patches)
    state = enc.prepare(pos)
    bias = enc.attn_bias(1, q, k, state)
    assert torch.all(bias[..., 0, :] == 0) and torch.all(bias[..., :, 0] == 0)
    assert bias[..., 1:, 1:].abs().max() > 0


def test_alibi_slopes_match_the_alibi_paper():
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2 ** (-0.5 * (i + 1)) for i in range(16)]))
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    torch.testing.assert_close(alibi_slopes(12)[8:], torch.tensor([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]))


def test_alibi_bias_is_minus_slope_times_distance():
    enc = make_encoding("alibi", num_prefix=0)
    coords = torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    bias = enc.attn_bias(0, None, None, enc.prepare(free_positions(coords, 0)))
    torch.testing.assert_close(bias[:, 0, 1], -5 * alibi_slopes(HEADS).double())


def reference_lookhere_slopes(split: list[tuple[str, int]]) -> list[float]:
    """The LookHere reference code's rule, written independently: per direction group, directional heads
    repeat(2^-(1..n/4), 4) (repeat_interleave), `none` heads 1/4, 1/16, 1/64, ..."""
    slopes = []
    for group, n in split:
        if group == "none":
            slopes += [4.0 ** -(i + 1) for i in range(n)]
        else:
            slopes += [2.0 ** -k for k in range(1, n // 4 + 1) for _ in range(4)]
    return slopes


@pytest.mark.parametrize("heads,split", [
    (12, [("corners", 4), ("triangles", 4), ("none", 4)]),  # LH-90
    (16, [("corners", 8), ("triangles", 4), ("none", 4)]),  # the reference's 16-head split
])
def test_lookhere_slopes_follow_the_reference_rule(heads, split):
    ctx = EncodingContext(heads * 8, heads, 2, (4, 4), 1)
    enc = create_encoding("lookhere", ctx)
    expected = 2.0 * torch.tensor(reference_lookhere_slopes(split))  # global slope 2
    torch.testing.assert_close(enc.head_slopes, expected)
    if heads == 12:
        assert enc.head_slopes[4:8].tolist() == [1.0] * 4  # triangle heads: 0.5 (x2), not 0.25


def test_lookhere_views_and_slopes():
    assert [v for v, _ in assign_head_views("corners-triangles-none", 12)] == [
        "top_left", "bottom_right", "top_right", "bottom_left", "up", "down", "left", "right",
        "none", "none", "none", "none",
    ]
    assert [v for v, _ in assign_head_views("corners-triangles-none", 16)][:8] == [
        "top_left", "bottom_right", "top_right", "bottom_left"] * 2
    assert len(assign_head_views("corners-triangles-none", 3)) == 3
    assert split_heads(["corners", "triangles", "none"], 6) == [2, 2, 2]
    with pytest.raises(ValueError, match="unknown LookHere head direction"):
        assign_head_views("corners-spirals", 12)
    enc = make_encoding("lookhere", grid=(5, 5), num_prefix=0)  # 2 heads: top_left, up (even split)
    pos = grid_positions((5, 5), 0, dtype=torch.float64)
    bias = enc.prepare(pos)
    centre, right, above, left_up = 12, 13, 7, 6
    assert torch.isinf(bias[0, centre, right]) and torch.isfinite(bias[0, centre, left_up])  # top-left view
    assert torch.isfinite(bias[1, centre, above]) and torch.isinf(bias[1, centre, right])  # upward wedge
    assert torch.all(torch.diagonal(bias, dim1=-2, dim2=-1) == 0), "every head sees its own token"
    torch.testing.assert_close(enc.layer_slopes, torch.tensor([1.5, 0.5], dtype=torch.float64))
    # layer slope scales the bias on the fly
    torch.testing.assert_close(enc.attn_bias(1, None, None, bias), bias * 0.5)


#: LookHere's views as its code writes them: which keys a head sees from the offset (dx, dy) = p_key - p_query
LOOKHERE_VIEWS = {
    "top_left": lambda dx, dy: (dx <= 0) & (dy <= 0),
    "top_right": lambda dx, dy: (dx >= 0) & (dy <= 0),
    "bottom_left": lambda dx, dy: (dx <= 0) & (dy >= 0),
    "bottom_right": lambda dx, dy: (dx >= 0) & (dy >= 0),
    "up": lambda dx, dy: (dy <= 0) & (dx.abs() <= -dy),
    "down": lambda dx, dy: (dy >= 0) & (dx.abs() <= dy),
    "left": lambda dx, dy: (dx <= 0) & (dy.abs() <= -dx),
    "right": lambda dx, dy: (dx >= 0) & (dy.abs() <= dx),
    "up_half": lambda dx, dy: dy <= 0,
    "down_half": lambda dx, dy: dy >= 0,
    "left_half": lambda dx, dy: dx <= 0,
    "right_half": lambda dx, dy: dx >= 0,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lookhere_hidden_keys_are_each_views_complement(dtype):
    """The views' hidden keys in fewer passes (``_HIDDEN``) are exactly the complement of the views as LookHere writes
    them, on the diagonals and axes where the inequalities are tight, for whole and scaled (interpolated) coordinates;
    the control, a view's own keys, is not."""
    from pape_hub.encodings.alibi import _GROUPS, _HIDDEN

    grid = grid_positions((9, 7), 0, dtype=dtype).coords  # (63, 2)
    scaled = [grid * 0.3 - 0.25, grid * torch.tensor([0.3, 1 / 7], dtype=dtype)]  # rounded offsets
    for whole, coords in [(True, grid)] + [(False, c) for c in scaled]:
        dx = coords[None, :, 0] - coords[:, None, 0]  # key x - query x, as LookHere takes them
        dy = coords[None, :, 1] - coords[:, None, 1]
        sizes = {"x": dx.abs(), "y": dy.abs()}
        views = [view for group in _GROUPS.values() for view in group if view != "none"]
        assert sorted(views) == sorted(_HIDDEN)
        for view in views:
            visible = LOOKHERE_VIEWS[view](dx, dy)
            assert 0 < visible.sum() < visible.numel()
            assert not whole or (visible & (dx.abs() == dy.abs()) & (dx != 0)).any()  # tight inequalities
            assert torch.equal(_HIDDEN[view](dx, dy, sizes), ~visible), view
            assert not torch.equal(_HIDDEN[view](dx, dy, sizes), visible)  # control
        if whole:  # control: a wedge's boundary (its diagonals) hidden as well is told apart
            assert not torch.equal((dx.abs() + dy) >= 0, ~LOOKHERE_VIEWS["up"](dx, dy))


def test_sincos_layout_x_first_and_cls_zero():
    enc = make_encoding("sincos", grid=(3, 4), num_prefix=1)
    pos = grid_positions((3, 4), 1, dtype=torch.float64)
    table = enc.prepare_table(pos)  # (1 + 12, D)
    assert torch.all(table[0] == 0)
    coords = pos.coords
    same_x = (coords[:, 0] == 1).nonzero().flatten() + 1
    first_half, second_half = table[same_x, : DIM // 2], table[same_x, DIM // 2 :]
    assert torch.allclose(first_half, first_half[0].expand_as(first_half))  # x half constant along a column
    assert not torch.allclose(second_half, second_half[0].expand_as(second_half))
    assert table[1, 0].item() == 0.0 and table[1, DIM // 4].item() == 1.0  # x=0: sin 0, cos 0


def test_rope_frequencies_follow_rope_vit():
    axial = make_encoding("rope")
    expected = 1.0 / 100.0 ** (torch.arange(0, HEAD_DIM, 4)[: HEAD_DIM // 4] / HEAD_DIM)
    torch.testing.assert_close(axial.freqs, expected.double())
    mixed = make_encoding("rope_mixed")
    mag = mixed.freqs.norm(dim=2)  # |(fx, fy)| per pair
    expected10 = 1.0 / 10.0 ** (torch.arange(0, HEAD_DIM, 4)[: HEAD_DIM // 4] / HEAD_DIM)
    torch.testing.assert_close(mag, expected10.double().repeat(2).expand_as(mag))
    assert mixed.no_weight_decay() == {"freqs"}
    assert not torch.allclose(mixed.freqs[0], mixed.freqs[1]), "random angle per layer"


def test_sape2_bias_is_symmetric_content_dependent_and_handles_other_grids():
    enc = make_encoding("sape2", grid=(4, 4), num_prefix=0)
    for grid in [(4, 4), (3, 7), (9, 9)]:  # train grid, non-square, larger than npos (positions clamp)
        pos = grid_positions(grid, 0, dtype=torch.float64)
        q, k, x = random_qkx(pos.num_patches)
        bias = enc.attn_bias(0, q, k, enc.prepare(pos))
        assert bias.shape == (2, HEADS, pos.num_patches, pos.num_patches)
        torch.testing.assert_close(bias, bias.transpose(-1, -2))
        torch.testing.assert_close(torch.diagonal(bias, dim1=-2, dim2=-1), torch.zeros(2, HEADS, pos.num_patches,
                                                                                        dtype=torch.float64))
        other = enc.attn_bias(0, q, k.flip(2), enc.prepare(pos))
        assert (other - bias).abs().max() > 1e-6


def literal_sape2_bias(q, k, tables, grid, scale, keys_at_or_after=True):
    """SaPE^2's eqs. 9-16 (key mode) written out with loops over the rows and columns of a (rows, cols) grid of patch
    tokens: gates g_ij = sigmoid(q_i . k_j / sqrt(d)) along the token's row (x) or column (y); p_im = the sum of g_ij
    over the keys at or after m (``keys_at_or_after=False``: before m, the control), clamped to npos - 1; z_i[p] = k_i .
    e[p], linearly interpolated between floor(p_im) and ceil(p_im); bias_in = (||SaPE_x[i] - SaPE_x[n]|| +
    ||SaPE_y[i] - SaPE_y[n]||) / sqrt(d). (B, H, N, d) -> (B, H, N, N)."""
    rows, cols = grid
    index = torch.arange(rows * cols).reshape(rows, cols)
    bias = torch.zeros(*q.shape[:2], rows * cols, rows * cols, dtype=q.dtype)
    for table, lines in ((tables[0], index), (tables[1], index.T)):  # x: along each row; y: along each column
        npos = table.shape[-1]
        vectors = torch.zeros(*q.shape[:2], rows * cols, lines.shape[1], dtype=q.dtype)
        for line in lines:
            for i in line.tolist():
                gates = torch.sigmoid((q[:, :, [i]] * k[:, :, line]).sum(-1) * scale)  # (B, H, L)
                for m in range(len(line)):
                    taken = gates[..., m:] if keys_at_or_after else gates[..., :m]
                    p = taken.sum(-1).clamp(max=npos - 1)
                    low, high = p.floor(), p.ceil()
                    z = k[:, :, i] @ table  # (B, H, npos)
                    z_low, z_high = (z.gather(-1, t.long()[..., None])[..., 0] for t in (low, high))
                    vectors[:, :, i, m] = z_low * (1 - (p - low)) + z_high * (p - low)
        bias += torch.cdist(vectors, vectors)
    return bias * scale


def test_sape2_bias_is_the_papers_equations_written_out():
    """The bias equals eqs. 9-16 written out with loops, in float64, on a non-square grid with a class token, position
    tables far from their init (std 1, not 0.02: at init the logits are near zero and every position looks alike) and
    queries and keys scaled up (gates away from 1/2), on a grid where sums of gates pass npos - 1 (the clamp). The
    control, the sum over the keys before m instead of at or after it, differs."""
    grid, train_grid = (4, 6), (3, 4)  # npos 5: rows of 6 gates sum past 4
    enc = make_encoding("sape2", grid=train_grid, num_prefix=1)
    with torch.no_grad():
        enc.pos_emb.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(3))
    pos = grid_positions(grid, 1, dtype=torch.float64)
    q, k, _ = random_qkx(1 + 24)
    q, k = q * 3, k * 3
    layer, scale = 1, enc.ctx.head_dim**-0.5
    bias = enc.attn_bias(layer, q, k, enc.prepare(pos))
    tables = enc.pos_emb[layer].detach()
    expected = literal_sape2_bias(q[:, :, 1:], k[:, :, 1:], tables, grid, scale)
    torch.testing.assert_close(bias[:, :, 1:, 1:], expected, rtol=1e-9, atol=1e-9)
    assert bias[:, :, 0].abs().max() == 0 and bias[:, :, :, 0].abs().max() == 0  # CLS: no bias
    control = literal_sape2_bias(q[:, :, 1:], k[:, :, 1:], tables, grid, scale, keys_at_or_after=False)
    assert (control - expected).abs().max() > 1e-3


def test_sape2_gradients_are_finite():
    enc = make_encoding("sape2", grid=(3, 3), num_prefix=1)
    pos = grid_positions((3, 3), 1, dtype=torch.float64)
    q, k, x = random_qkx(10)
    q.requires_grad_(True)
    enc.attn_bias(0, q, k, enc.prepare(pos)).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(enc.pos_emb.grad).all()


@pytest.mark.parametrize("grid", [(4, 4), (3, 7)])
@pytest.mark.parametrize("interpolate", [False, True])
def test_dinov3_rope_angles_follow_dinov3(grid, interpolate):
    """DINOv3's RoPE, written out: patch (row r, column c) of an H x W grid has coordinates
    y = 2 (r + 0.5) / H - 1 and x = 2 (c + 0.5) / W - 1 in [-1, 1], periods 100^(4k / head_dim), angles
    2 pi x / period_k then 2 pi y / period_k (this package's x-first, interleaved layout); prefix tokens unrotated.
    The coordinates are relative to the grid, so position interpolation changes nothing."""
    enc = make_encoding("rope_dinov3", num_prefix=2)
    pos = grid_positions(grid, 2, train_grid_size=(4, 4), interpolate=interpolate, dtype=torch.float64)
    cos, sin = enc.prepare(pos)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    x = 2 * (cols.flatten().double() + 0.5) / grid[1] - 1
    y = 2 * (rows.flatten().double() + 0.5) / grid[0] - 1
    periods = 100.0 ** (4 * torch.arange(HEAD_DIM // 4, dtype=torch.float64) / HEAD_DIM)
    angles = torch.cat([2 * math.pi * x[:, None] / periods, 2 * math.pi * y[:, None] / periods], dim=-1)
    # the frequencies are a float32 buffer, as AxialRoPE's (and timm's DINOv3 periods): float32-close, no closer
    cos, sin = cos[0, 0, 0], sin[0, 0, 0]  # (L, B', H, T, hd): one layer, grid and head
    torch.testing.assert_close(cos[2:], angles.cos().repeat_interleave(2, -1), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sin[2:, 1::2], angles.sin(), rtol=1e-6, atol=1e-7)
    assert torch.equal(cos[:2], torch.ones_like(cos[:2])) and not sin[:2].any()


def test_position_interpolation_scales_to_training_range():
    pos = grid_positions((28, 14), 1, train_grid_size=(14, 14), interpolate=True)
    assert pos.coords[:, 1].max().item() == pytest.approx(27 * 0.5)  # y axis halved
    assert pos.coords[:, 0].max().item() == pytest.approx(13)
    assert pos.scale == (1.0, 0.5)


def test_every_encoding_is_registered():
    assert set(list_encodings()) == {
        "none", "ape", "sincos", "rope", "rope_ape", "rope_mixed", "rope_mixed_ape", "alibi", "lookhere", "pape",
        "pape_ri", "polar_rope", "sape2", "sape2_ape", "liere8", "liere", "rope_dinov3",
    }


def test_free_form_positions_have_no_cache():
    assert TokenPositions(random_coords(3), 0).cache_key() is None
    assert isinstance(make_encoding("liere8"), LieRE)
    assert logits(make_encoding("none"), free_positions(random_coords(3), 0), *random_qkx(3)).shape == (2, HEADS, 3, 3)


def test_liere_per_layer_training_path_equals_cached_inference_path():
    enc = make_encoding("liere8", grid=(3, 4), num_prefix=1)
    pos = grid_positions((3, 4), 1, dtype=torch.float64)
    q, k, x = random_qkx(1 + pos.num_patches)
    lazy = enc.prepare(pos)  # gradients flow: rotations are made per layer in transform_qk
    assert lazy[1] is None
    with torch.no_grad():
        cached = enc.prepare(pos)
    assert cached[1] is not None
    for layer in range(enc.ctx.depth):
        for a, b in zip(transform(enc, layer, q, k, x, lazy), transform(enc, layer, q, k, x, cached)):
            torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12)
