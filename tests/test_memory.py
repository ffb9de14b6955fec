"""Exactness of the paths that keep memory flat on large grids, in float64, on weights away from init: attention in
blocks of query rows with the bias formed per block (bias encodings), each layer's own rotary tables / PaPE positions
/ LieRE rotations (made a block of tokens at a time) instead of every layer's at once. Each path is forced on a small
grid by lowering its threshold, and must give the outputs and the gradients of the whole-tensor path. Memory and time
themselves are measured by ``python -m lab memory``, not asserted here."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from helpers import naflex_batch

import pape_hub.encodings.base as base
import pape_hub.encodings.liere as liere
import pape_hub.encodings.pape as pape
import pape_hub.encodings.rotary as rotary
import pape_hub.layers.attention as attention


def query_blocks_of(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Blockwise attention in blocks of ``rows`` query rows where it takes :data:`base.BLOCK_ROWS` and where inference
    on CPU takes its own size."""
    monkeypatch.setattr(base, "BLOCK_ROWS", rows)
    monkeypatch.setattr(attention, "CPU_INFERENCE_BLOCK_ROWS", rows)


def perturbed(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, embed_dim=32, depth=2, num_heads=2, num_classes=5, **kwargs).double()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.2)
    return model


def outputs_and_gradients(model: torch.nn.Module, x) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    for module in model.modules():
        if hasattr(module, "_cache"):
            module._cache = {}
    with torch.no_grad():
        out = model.eval()(x)
    model.train().zero_grad()
    model(x).square().sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-10)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("encoding, by_hand", [("alibi", True), ("lookhere", True), ("sape2", True),
                                               ("sape2_ape", True), ("sape2", False), ("lookhere", False)])
def test_blockwise_bias_attention_is_the_whole_bias(encoding, by_hand, monkeypatch):
    """Outputs and gradients, by :class:`BlockwiseBiasAttention` (CPU training) and by SDPA with each block
    checkpointed (a GPU's path, forced here)."""
    model = perturbed(f"vit_t4_{encoding}")
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    whole = outputs_and_gradients(model, x)
    if not by_hand:
        monkeypatch.setattr(attention, "bias_gradient_by_hand", lambda q, dropout: False)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    query_blocks_of(monkeypatch, 7)  # blocks that do not divide the 121 tokens
    monkeypatch.setattr(attention, "BY_HAND_BLOCK_ROWS", 7)
    if encoding.startswith("sape2"):
        from pape_hub.encodings import sape2

        monkeypatch.setattr(sape2, "LINE_BLOCK_ELEMENTS", 50)  # and lines a few at a time
    calls = []
    blockwise = attention.PositionalAttention.blockwise
    monkeypatch.setattr(attention.PositionalAttention, "blockwise",
                        lambda self, *a: calls.append(1) or blockwise(self, *a))
    assert_same(outputs_and_gradients(model, x), whole)
    assert calls  # the blockwise path ran


@pytest.mark.parametrize("encoding", ["sape2", "sape2_ape"])
def test_sape2s_whole_bias_in_blocks_of_rows_is_the_whole_bias(encoding, monkeypatch):
    """On CPU SaPE²'s whole bias is written a block of query rows at a time (``CPU_ROW_BLOCK_BYTES``; without
    autograd ``IN_PLACE_ROWS_BYTES``, in place): the same outputs and gradients (blocks concatenated) as one block."""
    from pape_hub.encodings import sape2

    model = perturbed(f"vit_t4_{encoding}")
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    whole = outputs_and_gradients(model, x)
    blocks = []
    rows = sape2.SaPE2.distance_rows
    monkeypatch.setattr(sape2.SaPE2, "distance_rows", lambda self, v, s: (lambda *a, **k: blocks.append(a) or
                                                                          rows(self, v, s)(*a, **k)))
    monkeypatch.setattr(sape2, "CPU_ROW_BLOCK_BYTES", 8 * 2 * 2 * 121 * 7)  # 7 rows: blocks that do not divide 121
    monkeypatch.setattr(sape2, "IN_PLACE_ROWS_BYTES", 8 * 120 * 7)  # and 7 patch rows of a pair without gradients
    assert_same(outputs_and_gradients(model, x), whole)
    assert (0, 7) in blocks and (119, 121) in blocks  # the first and the last block


def test_sape2s_bias_rows_in_blocks_over_three_axes(monkeypatch):
    """The same for a video grid's three distance terms, with two prefix tokens: the first block holds both; every
    row of two (batch, head) pairs a chunk, of the four."""
    from helpers import make_encoding, random_qkx

    from pape_hub.encodings import sape2

    grid = (2, 3, 4)
    enc = make_encoding("sape2", grid=grid, num_prefix=2)
    q, k, _ = random_qkx(2 + 24)
    state = enc.prepare(base.grid_positions(grid, 2, dtype=torch.float64))
    with torch.no_grad():
        whole = enc.attn_bias(0, q, k, state).clone()  # the next call with this state overwrites it (SaPE2State)
        assert q.shape[0] * q.shape[1] == 4
        monkeypatch.setattr(sape2, "IN_PLACE_ROWS_BYTES", 8 * 24 * 24 * 3)  # 3 pairs' 24 rows at most: 2 and 2
        torch.testing.assert_close(enc.attn_bias(0, q, k, state), whole, rtol=0, atol=0)
        prefix_rows = enc.attn_bias_rows(0, q, k, state)(0, 1)  # a block of a prefix row alone
        assert prefix_rows.shape == (2, 2, 1, 26) and prefix_rows.eq(0).all()
    assert whole[..., :2, :].eq(0).all() and whole[..., :2].eq(0).all() and whole[..., 2:, 2:].gt(0).any()


def test_sape2s_layers_write_one_bias_memory_on_cpu_inference(monkeypatch):
    """On CPU without gradients every layer of a forward writes its whole bias into one memory (a fresh bias in each
    layer was mapped and faulted in anew), with the outputs of a fresh bias a layer, bit for bit. The control: a caller
    that keeps one layer's bias sees the next layer's, as documented."""
    from pape_hub.encodings import sape2

    model = perturbed("vit_t4_sape2").eval()
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    made = []
    attn_bias = sape2.SaPE2.attn_bias
    monkeypatch.setattr(sape2.SaPE2, "attn_bias", lambda *a: made.append(attn_bias(*a)) or made[-1])
    with torch.no_grad():
        shared = model(x)
        monkeypatch.setattr(sape2.SaPE2State, "scratch", lambda self, name, like, shape: like.new_empty(shape))
        separate = model(x)
    depth = len(model.blocks)
    assert len(made) == 2 * depth
    assert len({bias.data_ptr() for bias in made[:depth]}) == 1  # one memory for every layer
    torch.testing.assert_close(shared, separate, rtol=0, atol=0)
    assert torch.equal(made[0], made[depth - 1]) and not torch.equal(made[depth], made[2 * depth - 1])


def test_sape2s_blocks_share_one_memory_on_cpu_inference(monkeypatch):
    """On the blockwise path without gradients every block of bias rows of a layer is written into one memory, with
    its distances in cdist's matmul form made from factors kept per layer: the outputs of fresh blocks from
    ``torch.cdist``, bit for bit. The layer's last block releases the memory (it is not held through the MLP, where
    the forward's peak is). The control: fresh blocks are separate tensors."""
    from pape_hub.encodings import sape2

    model = perturbed("vit_t4_sape2").eval()
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    query_blocks_of(monkeypatch, 7)  # blocks that do not divide the 121 tokens
    made, held = [], []
    distance_rows = sape2.SaPE2.distance_rows

    def recording(self, vectors, state):
        rows = distance_rows(self, vectors, state)

        def recorded(*a, **k):
            made.append(rows(*a, **k))
            held.append(sorted(state.memory))
            return made[-1]
        return recorded

    monkeypatch.setattr(sape2.SaPE2, "distance_rows", recording)
    with torch.no_grad():
        shared = model(x)
        blocks = len(made)
        monkeypatch.setattr(sape2, "CDIST_MM_FROM", 10**9)  # torch.cdist itself
        monkeypatch.setattr(sape2.SaPE2State, "scratch", lambda self, name, like, shape: like.new_empty(shape))
        separate = model(x)
    assert blocks == 2 * 18 and len(made) == 2 * blocks  # two layers of 18 blocks, twice
    for layer in range(2):  # one memory for every block of a layer, released after its last
        assert len({block.data_ptr() for block in made[18 * layer : 18 * (layer + 1)]}) == 1
        assert "block" in held[18 * layer + 16] and "block" not in held[18 * layer + 17]
    assert len({block.data_ptr() for block in made[blocks:]}) > 1
    torch.testing.assert_close(shared, separate, rtol=0, atol=0)


def ops_of(call) -> list[tuple[str, tuple[int, ...]]]:
    """The aten ops a call runs, in order, each with its output's shape (() where not one tensor)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ops.append((str(func.overloadpacket), tuple(out.shape) if isinstance(out, torch.Tensor) else ()))
            return out

    ops: list[tuple[str, tuple[int, ...]]] = []
    with Record():
        call()
    return ops


@pytest.mark.parametrize("in_place", [False, True])
def test_sape2s_block_is_made_after_its_distances_where_not_in_place(in_place, monkeypatch):
    """Where each block of bias rows is a tensor of its own (a GPU, autograd, a compiled graph), it is made after its
    rows' distances: made first, it was live beside their temporaries (cdist's float32 matmul under bf16 autocast),
    +4.6 MB of peak at ViT-S/16 896 px (GPU, 1.53x -> 1.65x `ape`). The control: the in-place path writes into its
    scratch block, made first."""
    from helpers import make_encoding, random_qkx

    from pape_hub.encodings import sape2

    monkeypatch.setattr(sape2, "writes_in_place", lambda t: in_place)
    grid = (6, 7)
    enc = make_encoding("sape2", grid=grid, num_prefix=1)
    q, k, _ = random_qkx(1 + 42)
    state = enc.prepare(base.grid_positions(grid, 1, dtype=torch.float64))
    with torch.no_grad():
        rows = enc.attn_bias_rows(0, q, k, state)
        ops = ops_of(lambda: rows(0, 43))
    block = (*q.shape[:2], 43, 43)  # (B, H, rows, P+N); in place, a view of scratch made flat
    made = [i for i, (op, shape) in enumerate(ops) if op in ("aten.new_empty", "aten.empty")
            and shape in (block, (math.prod(block),))]
    distances = [i for i, (op, _) in enumerate(ops) if op in ("aten._euclidean_dist", "aten.bmm", "aten.mm")]
    assert len(made) == 1 and distances
    made = made[0]
    assert (made < min(distances)) if in_place else (made > max(distances))


def test_sape2s_in_place_distances_are_matrix_products_of_one_pairs_rows(monkeypatch):
    """Without gradients SaPE²'s distances are written a chunk of :data:`IN_PLACE_ROWS_BYTES` at a time: rows of one
    (batch, head) pair, as many as fit, split evenly. Chunks of rows across every pair held a single row once one row
    of (B, H, 1, N) outgrew the chunk (ViT-B/16, 1024 px, batch 8: 1.5 MB of 2 MB), so that every matmul was a
    matrix-vector product, 12x slower; and a short last chunk costs nearly a full one (ViT-B/16 448 px: 668 rows, then
    116). Here one row across the 4 pairs is 3,840 bytes of a 12,480 byte chunk: 13 rows of one pair at most, so ten
    chunks of 12 rows (not nine of 13 and one of 3)."""
    from helpers import make_encoding, random_qkx

    from pape_hub.encodings import sape2

    grid = (10, 12)
    enc = make_encoding("sape2", grid=grid, num_prefix=1)
    q, k, _ = random_qkx(1 + 120)
    state = enc.prepare(base.grid_positions(grid, 1, dtype=torch.float64))
    monkeypatch.setattr(sape2, "IN_PLACE_ROWS_BYTES", 8 * 120 * 13)
    with torch.no_grad():
        whole = enc.attn_bias_rows(0, q, k, state)(0, 121).clone()
        rows = enc.attn_bias_rows(0, q, k, state)
        ops = ops_of(lambda: rows(0, 121))
    products = [shape for op, shape in ops if op in ("aten.bmm", "aten.mm", "aten.matmul")]
    assert sorted(set(products)) == [(1, 12, 120)]  # (pairs, rows, N)
    assert len(products) == 2 * 4 * 10  # two axes, four pairs, ten chunks
    monkeypatch.setattr(sape2, "IN_PLACE_ROWS_BYTES", 2 << 20)  # one chunk: the same values, but for rounding on the
    # diagonal, where the distance is the square root of |a|^2 - 2 a.a + |a|^2's rounding (cdist's too) in any chunks
    torch.testing.assert_close(whole, enc.attn_bias_rows(0, q, k, state)(0, 121), rtol=0, atol=1e-8)


@pytest.mark.parametrize("grad", [False, True])
def test_blockwise_attention_writes_each_block_into_the_layers_output_without_gradients(grad, monkeypatch):
    """Without gradients each block's attention output goes straight into the layer's (B, H, T, hd) output, with the
    outputs of the whole-bias path: blocks kept for a final ``cat`` sat between the freed biases on
    glibc's heap (LookHere at ViT-S/16 896 px: 287-296 MB resident against 119-136 MB). The control: with gradients
    through SDPA (checkpointed blocks, as on a GPU) the outputs are concatenated."""
    model = perturbed("vit_t4_lookhere").eval()
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    monkeypatch.setattr(attention, "bias_gradient_by_hand", lambda q, dropout: False)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    query_blocks_of(monkeypatch, 7)  # blocks that do not divide the 121 tokens
    with torch.set_grad_enabled(grad):
        ops = ops_of(lambda: model(x))
        written = model(x)
    whole_outputs = (2, 2, 121, 16)  # (B, H, T, hd): one layer's attention output
    assert (("aten.cat", whole_outputs) in ops) == grad
    with torch.no_grad():
        monkeypatch.setattr(base, "BLOCKWISE_FROM", 10**9)
        torch.testing.assert_close(written, model(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gram_distances_are_cdists_bit_for_bit(dtype):
    """SaPE²'s distances from the keys' factor made once per layer, and a block's queries' side taken from its rows,
    are torch.cdist's from :data:`CDIST_MM_FROM` points, bit for bit, written into the memory given. The control:
    cdist's direct differences give other values."""
    from pape_hub.encodings import sape2

    v = torch.randn(2, 3, 40, 7, dtype=dtype, generator=torch.Generator().manual_seed(0))
    keys = sape2.gram_keys(v)
    out = torch.empty(2, 3, 13, 40, dtype=dtype)
    got = sape2.gram_distances_into(out, sape2.gram_queries(keys[:, :, 5:18]), keys.mT)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, torch.cdist(v[:, :, 5:18], v))
    assert not torch.equal(got, torch.cdist(v[:, :, 5:18], v, compute_mode="donot_use_mm_for_euclid_dist"))


def test_sape2_keeps_one_factor_an_axis_and_drops_the_vectors_in_place():
    """Without gradients on CPU a layer keeps only the keys' side of each axis's distances (B * H, N, L + 2), and
    drops each axis's SaPE vectors once its factor is made: with both sides of the product kept beside the vectors
    and their scaled copies, SaPE² at ViT-B/16, 1024 px, batch 8 held 1,772 MB resident against 1,642 MB before the
    factors (docs/speed.md). The control: with gradients nothing is factored, and the rows name the scaled vectors as
    their inputs."""
    from helpers import make_encoding, random_qkx

    grid = (6, 7)
    enc = make_encoding("sape2", grid=grid, num_prefix=1)
    q, k, _ = random_qkx(1 + 42)
    state = enc.prepare(base.grid_positions(grid, 1, dtype=torch.float64))

    def held(fn) -> list[tuple[int, ...]]:  # shapes of the tensors the rows' closures keep (lists of them too)
        shapes = []
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            if callable(value) and getattr(value, "__closure__", None):
                shapes += held(value)
            for t in value if isinstance(value, list) else ():
                shapes += [tuple(t.shape)] if isinstance(t, torch.Tensor) else []
        return shapes

    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            vectors = enc.sape_vectors(0, q.requires_grad_(grad), k, state)
            shapes = [tuple(v.shape) for v in vectors]  # (B, H, N, L) per axis
            rows = enc.distance_rows(vectors, state)
            if grad:  # the rows' inputs, for blockwise attention's backward: the scaled vectors, no factor
                assert isinstance(rows, base.BiasRows) and len(vectors) == 2
                assert sorted({tuple(t.shape) for t in rows.inputs}) == sorted(set(shapes))
            else:
                assert vectors == [] and sorted(set(held(rows))) == sorted({(B * H, N, L + 2) for B, H, N, L in shapes})


def test_blockwise_bias_attention_by_hand_is_sdpas_math_and_names_its_inputs():
    """:class:`BlockwiseBiasAttention` against SDPA's math kernel on the whole bias, in float64: outputs and the
    gradients of q, k, v and of the tensor the bias is made from, with a query row that sees no key (zeros, as SDPA's
    safe softmax gives) and a bias the batch shares. The control: bias rows that need gradients from a tensor they do
    not name fail loudly in backward instead of dropping its gradient."""
    torch.manual_seed(0)
    B, H, T, d = 2, 3, 20, 8
    q, k, v = (torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(1, H, T, T, dtype=torch.float64, requires_grad=True)
    hidden = torch.zeros(1, 1, T, T, dtype=torch.bool)
    hidden[..., 4, :] = True  # query 4 sees no key
    make = lambda start, stop, t: (t * 2).masked_fill(hidden, float("-inf"))[:, :, start:stop]  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention, "BY_HAND_BLOCK_ROWS", 7)
        ours = attention.BlockwiseBiasAttention.apply(q, k, v, base.BiasRows(make, (table,)), 0.3, table)
        theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=make(0, T, table), scale=0.3)
        assert ours[:, :, 4].abs().max() == 0 and theirs[:, :, 4].abs().max() == 0
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
        weights = torch.randn_like(ours)
        grads = [torch.autograd.grad((out * weights).sum(), (q, k, v, table)) for out in (ours, theirs)]
        for name, a, b in zip("q k v bias".split(), *grads):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)
        unnamed = base.BiasRows(lambda start, stop: make(start, stop, table))  # control: the table, unnamed
        out = attention.BlockwiseBiasAttention.apply(q, k, v, unnamed, 0.3)
        with pytest.raises(RuntimeError, match="do not name"):
            out.sum().backward()


def test_sape2s_distance_rows_by_hand_are_autograds_through_cdist():
    """SaPE²'s :class:`DistanceRowsByHand` adds eq. 16's rows into logits, block by block, and gives the vectors the
    gradients autograd gives through :func:`bias_rows_of` (torch.cdist), in float64: with a prefix row and column, axes
    of different lengths, blocks of uneven size and two tokens at one point (distance 0: cdist's zero subgradient, no
    NaN). The control: the gradient through the rows' side alone (the keys held constant) is not the whole."""
    from pape_hub.encodings import sape2

    torch.manual_seed(0)
    # whole numbers: every squared distance exact in the matmul form, so that a distance of 0 is 0 there (in general it
    # is the square root of rounding, ~1e-8, with a gradient of cancelling huge terms in cdist and by hand alike)
    patches = sape2.CDIST_MM_FROM + 4  # cdist in its matmul form, as by hand
    vectors = [torch.randint(-4, 5, (2, 3, patches, length)).double() for length in (6, 5)]
    for v in vectors:
        v[:, :, 5] = v[:, :, 2]  # tokens 2 and 5 at one point on both axes
        v.requires_grad_(True)
    T = patches + 1  # a prefix token
    grad_logits = torch.randn(2, 3, T, T, dtype=torch.float64)
    by_hand, logits = sape2.DistanceRowsByHand(*vectors, prefix=1), torch.zeros(2, 3, T, T, dtype=torch.float64)
    for start, stop in [(0, 7), (7, 20), (20, T)]:
        by_hand.add_rows(logits[:, :, start:stop], start, stop)
        by_hand.backward_rows(grad_logits[:, :, start:stop], start, stop)
    bias = sape2.bias_rows_of(0, T, *vectors, prefix=1)
    torch.testing.assert_close(logits, bias, rtol=0, atol=1e-12)
    ours, theirs = by_hand.grads(), torch.autograd.grad(bias, vectors, grad_logits)
    for a, b in zip(ours, theirs):
        assert a.isfinite().all()
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    rows_only = sum(sape2.pairwise_l2(v, v.detach()) for v in vectors)  # control: the keys held constant
    control = torch.autograd.grad(rows_only, vectors, grad_logits[:, :, 1:, 1:])
    assert not torch.allclose(control[0], ours[0], atol=1e-6)


def test_sape2s_token_logits_keep_the_strided_keys_and_give_matmuls_gradients():
    """:class:`TokenLogits` (every axis's position logits in one product, in training) gives torch.matmul's values and
    gradients in float64, and keeps attention's strided keys themselves for backward (no storage of their size beyond
    theirs); the control: torch.matmul keeps a contiguous copy of them."""
    from pape_hub.encodings import sape2

    torch.manual_seed(0)
    qkv = torch.randn(2, 13, 3, 4, 8, dtype=torch.float64).permute(2, 0, 3, 1, 4)  # (3, B, H, T, d), as attention's
    k = qkv[1].detach().requires_grad_()[:, :, 1:]  # strided, prefix dropped
    emb = torch.randn(8, 10, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 4, 12, 10, dtype=torch.float64)

    def saved_storages(fn) -> tuple[torch.Tensor, set[int]]:
        seen = set()

        def pack(t):
            seen.add(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
        return out, seen

    ours, ours_saved = saved_storages(lambda: sape2.token_logits(k, emb))
    theirs, theirs_saved = saved_storages(lambda: k @ emb)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(ours, (k, emb), grad), torch.autograd.grad(theirs, (k, emb), grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    mine = {k.untyped_storage().data_ptr(), emb.untyped_storage().data_ptr()}
    assert ours_saved <= mine
    assert not theirs_saved <= mine  # the control: matmul's own copy of the keys


@pytest.mark.parametrize("key_mode", [True, False])
def test_sape2s_contextual_position_logits_by_hand_are_autograds(key_mode):
    """:class:`ContextualPositionLogits` (the gradient by hand, holding the gates and logits alone) gives the outputs
    and the gradients of q, k and the position-logit table that autograd gives through the same terms, in float64:
    with empty cells and positions past a sample's grid (a padded batch's masks) and sums of gates past the table's
    last position (the clamp). The control: the same terms without the ``inside`` mask give other gradients."""
    from pape_hub.encodings import sape2

    torch.manual_seed(0)
    q, k = ((torch.randn(2, 3, 5, 7, 8, dtype=torch.float64) * 2).requires_grad_() for _ in range(2))
    table = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)  # 6 positions: sums up to 7 are clamped
    present = torch.rand(2, 1, 5, 7) > 0.2
    inside = (torch.arange(7) < torch.tensor([5, 7])[:, None]).reshape(2, 1, 1, 7).expand(2, 1, 5, 7)
    grad = torch.randn(2, 3, 5, 7, 7, dtype=torch.float64)
    ours = sape2.contextual_position_logits(q, k, table, 0.35, key_mode, present, inside)
    assert ours.grad_fn.name() == "ContextualPositionLogitsBackward"

    def terms() -> sape2.LineTerms:  # autograd through every term
        return sape2.LineTerms.from_products(sape2.line_gates(q, k, 0.35), (k if key_mode else q) @ table, present)

    theirs = terms().interpolated(inside)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    ours_grads = torch.autograd.grad(ours, (q, k, table), grad)
    for name, a, b in zip(("q", "k", "table"), ours_grads, torch.autograd.grad(theirs, (q, k, table), grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)
    control = terms().interpolated(None)
    assert not torch.allclose(torch.autograd.grad(control, q, grad)[0], ours_grads[0], atol=1e-6)


def test_blockwise_training_under_gradient_checkpointing_gives_the_whole_bias_gradients(monkeypatch):
    """timm's gradient checkpointing makes each block's forward again in backward: the gradients by hand then come
    from the bias inputs made again (those :class:`BiasRows` names), as the whole bias's without checkpointing."""
    model = perturbed("vit_t4_sape2")
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    whole = outputs_and_gradients(model, x)
    model.set_grad_checkpointing(True)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    monkeypatch.setattr(attention, "BY_HAND_BLOCK_ROWS", 7)
    assert_same(outputs_and_gradients(model, x), whole)


@pytest.mark.parametrize("encoding", ["lookhere", "sape2"])
def test_blockwise_training_with_padding_gives_the_whole_bias_gradients(encoding, monkeypatch):
    """A padded NaFlex batch in training: the bias per sample, the padding mask in each block, gradients by hand
    through every bias input (SaPE²'s vectors), as the whole-bias path gives them."""
    model = perturbed(f"vit_t4_{encoding}")
    batch = naflex_batch([torch.randn(3, 32, 48, dtype=torch.float64), torch.randn(3, 40, 40, dtype=torch.float64)])
    whole = outputs_and_gradients(model, batch)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    monkeypatch.setattr(attention, "BY_HAND_BLOCK_ROWS", 9)
    calls = []
    by_hand = attention.BlockwiseBiasAttention.apply
    monkeypatch.setattr(attention.BlockwiseBiasAttention, "apply", lambda *a: calls.append(1) or by_hand(*a))
    assert_same(outputs_and_gradients(model, batch), whole)
    assert calls  # the gradients came by hand


@pytest.mark.parametrize("encoding", ["alibi", "lookhere"])
def test_blockwise_attention_with_padding_gives_each_image_its_own_logits(encoding, monkeypatch):
    model = perturbed(f"vit_t4_{encoding}").eval()
    images = [torch.randn(3, 32, 48, dtype=torch.float64), torch.randn(3, 40, 40, dtype=torch.float64)]
    batch = naflex_batch(images)
    monkeypatch.setattr(base, "BLOCKWISE_FROM", 16)
    query_blocks_of(monkeypatch, 9)
    with torch.no_grad():
        out = model(batch)
        for i, image in enumerate(images):
            torch.testing.assert_close(out[i], model(image[None])[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("encoding", ["rope_mixed", "pape", "liere8", "liere"])
def test_per_layer_state_on_large_grids_is_the_all_layer_state(encoding, monkeypatch):
    model = perturbed(f"vit_t4_{encoding}")
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    all_layers = outputs_and_gradients(model, x)
    for module in (rotary, pape, liere):
        monkeypatch.setattr(module, "STATE_BYTES", 1000)
    monkeypatch.setattr(liere, "CACHE_BYTES", 1000)
    monkeypatch.setattr(liere, "BLOCK_BYTES", 20_000)  # LieRE's rotations a few tokens at a time
    monkeypatch.setattr(liere, "INFERENCE_BLOCK_BYTES", 30_000)  # and without gradients, into the output
    assert_same(outputs_and_gradients(model, x), all_layers)


def test_the_thresholds_leave_training_sizes_on_the_fast_path():
    """The speed tables' sizes (ViT-B/16 at 224 and 448 px) stay under the blockwise threshold; 896 px is over it."""
    assert base.blockwise(28 * 28 + 1) is False and base.blockwise(56 * 56 + 1) is True


@pytest.mark.parametrize(("encoding", "shared"), [("alibi", True), ("lookhere", True), ("sape2", False)])
def test_training_counts_a_bias_the_batch_shares_once(encoding, shared, monkeypatch):
    """In training the blockwise line is one layer's bias: a grid's content-free bias (ALiBi, LookHere) is one
    (heads, T, T) for the whole batch, so a batch of 4 that a per-sample bias (SaPE²) would send blockwise stays whole;
    the control, a per-sample bias of the same size, goes blockwise."""
    model = perturbed(f"vit_t4_{encoding}").train()
    x = torch.randn(4, 3, 32, 32, dtype=torch.float64)  # 64 patches + CLS; heads 2
    one_bias = 4 * 2 * 65**2
    monkeypatch.setattr(base, "STATE_BYTES", 2 * one_bias)  # over one bias, under the batch's four
    calls = []
    blockwise = attention.PositionalAttention.blockwise
    monkeypatch.setattr(attention.PositionalAttention, "blockwise",
                        lambda self, *a: calls.append(1) or blockwise(self, *a))
    model(x).sum().backward()
    assert bool(calls) is not shared


@pytest.mark.parametrize("table", [True, False])
def test_liere_blocks_of_per_sample_tokens_rotate_each_distinct_coordinate_once_a_layer(table, monkeypatch):
    """Without gradients on a large grid LieRE rotates a block of tokens at a time. A batch of grids repeats its cells,
    but a block of tokens shares few of them: blocks that each took their own distinct coordinates ran many more
    matrix exponentials (dense LieRE, a NaFlex batch at ViT-S/16: 3.9 s a forward against 2.5 s). So the layer's
    distinct coordinates get one table, one ``rotation_exp`` call a layer, and each image keeps its own logits. The
    control: a table over STATE_BYTES falls back to blocks that make their own, more calls."""
    model = perturbed("vit_t4_liere").eval()
    images = [torch.randn(3, 32, 48, dtype=torch.float64), torch.randn(3, 40, 40, dtype=torch.float64),
              torch.randn(3, 48, 32, dtype=torch.float64)]
    batch = naflex_batch(images)
    enc = model.pos_encoding
    per_token = enc.ctx.num_heads * enc.num_blocks * enc.block_size**2  # the elements of one token's rotations
    distinct = len({tuple(c) for c in batch["patch_coord"].flatten(0, 1).tolist()})
    # the layer's per-sample rotations over STATE_BYTES (blockwise); the table of the distinct ones under it, or not
    monkeypatch.setattr(liere, "STATE_BYTES", 8 * per_token * (distinct if table else distinct // 2))
    assert 4 * 3 * (batch["patches"].shape[1] + model.num_prefix_tokens) * per_token > liere.STATE_BYTES
    monkeypatch.setattr(liere, "CACHE_BYTES", 1000)
    monkeypatch.setattr(liere, "BLOCK_BYTES", 200_000)
    monkeypatch.setattr(liere, "INFERENCE_BLOCK_BYTES", 200_000)
    calls = []
    rotation_exp = liere.rotation_exp
    monkeypatch.setattr(liere, "rotation_exp",  # the call's matrices: heads * positions * blocks
                        lambda pos, skew, *rest: calls.append(skew.shape[0] * pos.shape[0] * skew.shape[1])
                        or rotation_exp(pos, skew, *rest))
    with torch.no_grad():
        out = model(batch)
    assert (calls == [enc.ctx.num_heads * enc.num_blocks * distinct] * len(model.blocks)) == table
    assert len(calls) > len(model.blocks) or table
    with torch.no_grad():
        for i, image in enumerate(images):
            torch.testing.assert_close(out[i], model(image[None])[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("encoding", ["vit_t4_liere", "vit_t4_liere8"])
def test_liere_keeps_a_naflex_batchs_cell_rotations_across_forwards(encoding, monkeypatch):
    """Per-token coordinates key no cache, but whole ones (NaFlex's patch indices) name cells: without gradients LieRE
    takes their rotations from a table of the cells of a rectangle that holds them, kept across forwards. One table a
    layer; a batch inside the rectangle makes no exponential, a larger one grows it once; the logits are each image's
    alone and the path's without the table (float64). The controls: a parameter change makes the table again and
    moves the logits; free or negative coordinates and gradients take no table."""
    model = perturbed(encoding).eval()
    enc, depth = model.pos_encoding, len(model.blocks)
    calls = []
    rotation_exp = liere.rotation_exp
    monkeypatch.setattr(liere, "rotation_exp", lambda *args: calls.append(1) or rotation_exp(*args))
    images = [torch.randn(3, 32, 48, dtype=torch.float64), torch.randn(3, 40, 40, dtype=torch.float64)]
    small, large = naflex_batch([torch.randn(3, 24, 20, dtype=torch.float64)]), naflex_batch(images)
    with torch.no_grad():
        out_small = model(small)
        assert len(calls) == depth  # one table a layer
        out = model(large)  # outside the rectangle: it grows, once
        assert len(calls) == 2 * depth
        torch.testing.assert_close(model(small), out_small, rtol=0, atol=1e-12)  # the grown table's, to rounding
        assert len(calls) == 2 * depth  # inside it: no exponential
        for i, image in enumerate(images):
            torch.testing.assert_close(out[i], model(image[None])[0], rtol=0, atol=1e-10)
        monkeypatch.setattr(liere, "CACHE_BYTES", 0)  # no table: each forward makes its distinct coordinates'
        calls.clear()
        torch.testing.assert_close(model(large), out, rtol=0, atol=1e-12)
        assert calls
        monkeypatch.setattr(liere, "CACHE_BYTES", 256 << 20)
        enc.generators.mul_(1.1)  # the control: the table is made again from the new generators
        calls.clear()
        moved = model(large)
        assert len(calls) == depth and (moved - out).abs().max() > 1e-3
    whole = torch.tensor([[[0.0, 0.0], [2.0, 1.0]]], dtype=torch.float64)
    with torch.no_grad():
        assert enc.cell_rotations(whole) is not None
        assert enc.cell_rotations(whole + 0.5) is None and enc.cell_rotations(whole - 1) is None
    assert enc.cell_rotations(whole) is None  # with gradients the rotations carry the generators' graph


def test_liere_inference_blocks_are_whole_rays(monkeypatch):
    """Without gradients on a large grid LieRE rotates blocks of whole rays from the origin (:class:`liere.Rays`), so
    that each ray's tokens take their rotations from one exponential: a Taylor polynomial per ray, not per token, and
    the output equals the per-token exponentials'. The control: without rays (coordinates that are not whole), every
    token gets its own polynomial, and blocks are runs of tokens."""
    model = perturbed("vit_t4_liere").eval()
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)  # 10 x 12 patches and CLS
    for name in ("STATE_BYTES", "CACHE_BYTES"):
        monkeypatch.setattr(liere, name, 1000)
    monkeypatch.setattr(liere, "INFERENCE_BLOCK_BYTES", 20_000)
    made = []
    polynomials = liere.TaylorPolynomials.of
    monkeypatch.setattr(liere.TaylorPolynomials, "of", lambda pos, *a: made.append(len(pos)) or polynomials(pos, *a))
    blocks = []
    token_blocks = liere.token_blocks
    monkeypatch.setattr(liere, "token_blocks", lambda *a: blocks.append(token_blocks(*a)) or blocks[-1])
    with torch.no_grad():
        out = model(x)
    grid = torch.cartesian_prod(torch.arange(10.0), torch.arange(12.0)).flip(-1)  # (x, y) in row-major order
    rays, _ = liere.ray_of_tokens(torch.cat([torch.zeros(1, 2), grid]))  # CLS at the origin
    assert len(blocks) == len(model.blocks) and len(blocks[0]) > 2
    for block in blocks[0]:  # each ray's tokens all in one block
        assert set(rays[block].tolist()).isdisjoint(rays[torch.cat([b for b in blocks[0] if b is not block])].tolist())
    assert sum(made) == len(model.blocks) * len(set(rays.tolist())) < 0.75 * len(model.blocks) * len(rays)
    made.clear()
    monkeypatch.setattr(liere, "ray_of_tokens", lambda coords: None)
    with torch.no_grad():
        torch.testing.assert_close(model(x), out, rtol=0, atol=1e-10)
    assert sum(made) == len(model.blocks) * len(rays)


@pytest.mark.parametrize("grad", [False, True])
def test_liere_blocks_of_tokens_share_their_layers_words(grad, monkeypatch):
    """On a large grid LieRE rotates a block of tokens at a time; the Taylor words of a layer's generators are made
    once a layer, not once a block (a 1 MB block of dense LieRE at ViT-B/16 is 5 tokens: making them for each took
    448 px inference from 7.1 s to 46.6 s), with and without gradients. The control: the blocks are several a layer."""
    model = perturbed("vit_t4_liere")
    x = torch.randn(2, 3, 40, 48, dtype=torch.float64)
    for name in ("STATE_BYTES", "CACHE_BYTES"):
        monkeypatch.setattr(liere, name, 1000)
    monkeypatch.setattr(liere, "BLOCK_BYTES", 20_000)
    monkeypatch.setattr(liere, "INFERENCE_BLOCK_BYTES", 20_000)
    words, blocks = [], []
    taylor_words, taylor_polynomials = liere.taylor_words, liere.TaylorPolynomials.of
    monkeypatch.setattr(liere, "taylor_words", lambda g: words.append(1) or taylor_words(g))
    monkeypatch.setattr(liere.TaylorPolynomials, "of", lambda *a: blocks.append(1) or taylor_polynomials(*a))
    with torch.set_grad_enabled(grad):
        out = model(x)
    assert len(words) == len(model.blocks) and len(blocks) > 2 * len(model.blocks)
    if grad:
        out.sum().backward()
        assert model.pos_encoding.generators.grad.abs().sum() > 0


@pytest.mark.parametrize("rays", [False, True])
@pytest.mark.parametrize("block", [8, 64])
def test_liere_generator_rotation_is_autograd_through_its_exponentials(block, rays, monkeypatch):
    """LieRE's large grids in CPU training rotate queries and keys through ``GeneratorRotation``, whose backward makes
    each chunk's exponentials once and takes both gradients from them; along rays from the origin (a grid's tokens,
    ``rays``) it keeps its primitive points' squarings and takes the gradients through the products of each multiple
    too. Against autograd through torch's ``matrix_exp`` and an einsum, in float64 on norms up to a 448 px grid's,
    several chunks mixing squaring counts: outputs, the queries' and keys' gradient and the generators'. The control:
    the positions of the tokens reversed give other gradients (each token takes its own rotation)."""
    torch.manual_seed(0)
    monkeypatch.setattr(liere, "EXP_CHUNK_BYTES", 8 * 7 * block**2)  # chunks of 7 matrices: several, and a short one
    if rays:  # a 5 x 6 grid from the origin: 18 rays, multiples up to 5
        coords = torch.cartesian_prod(torch.arange(5.0), torch.arange(6.0)).double()
        pos, along = coords * 2.1 / 5, liere.Rays.of(coords)
        assert len(along.first) == 18 and len(along.steps) == 4
    else:
        pos = torch.cat([torch.zeros(1, 2, dtype=torch.float64), torch.rand(8, 2, dtype=torch.float64) * 2.1])
        along = None
    heads, blocks, tokens = 2, 64 // block, len(pos)
    raw = torch.rand(heads, blocks, 2, block, block, dtype=torch.float64) * 2 * math.pi  # the reference's init
    skew = liere.skew_symmetric(raw).requires_grad_()
    qk = torch.randn(2, 3, heads, tokens, 64, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, heads, tokens, 64, dtype=torch.float64)

    def autograd_path(positions: torch.Tensor) -> torch.Tensor:
        log_rot = torch.einsum("np,hgpij->hngij", positions, skew)
        rot = torch.linalg.matrix_exp(log_rot.contiguous())
        blocks_of = qk.unflatten(-1, (blocks, block))
        return torch.einsum("htgij,sbhtgj->sbhtgi", rot, blocks_of).flatten(-2)

    theirs = autograd_path(pos)
    gains, words = liere.normalised_words(skew)
    ours = liere.GeneratorRotation.apply(qk, pos, words, gains, along)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-11)
    grads_ours = torch.autograd.grad((ours * weights).sum(), (qk, skew))
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), (qk, skew))
    for a, b in zip(grads_ours, grads_theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    reversed_tokens = torch.autograd.grad((autograd_path(pos.flip(0)) * weights).sum(), (qk, skew))
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(grads_ours, reversed_tokens))


@pytest.mark.parametrize("axes", [2, 3])
def test_distances_an_axis_at_a_time_are_the_norm_of_the_differences(axes):
    """ALiBi's and LookHere's distances, squared and summed an axis at a time in place, are the norm of the coordinate
    differences to float64's rounding (and exact on a grid of whole coordinates); the control, one axis left out, is
    not."""
    from pape_hub.encodings.alibi import offset_length, pairwise_distance

    coords = torch.randn(2, 50, axes, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 20
    norm = (coords[:, :, None] - coords[:, None]).norm(dim=-1)
    torch.testing.assert_close(pairwise_distance(coords), norm, rtol=1e-15, atol=0)
    grid = torch.cartesian_prod(*[torch.arange(5.0)] * axes)
    exact = (grid[:, None] - grid[None]).square().sum(-1).sqrt()  # whole squares: the sum is exact
    assert torch.equal(pairwise_distance(grid, grid[:7]), exact[:, :7])
    offsets = [coords[:, :, None, axis] - coords[:, None, :, axis] for axis in range(axes - 1)]
    assert not torch.allclose(offset_length(offsets), norm)


@pytest.mark.parametrize("encoding", ["vit_t4_liere8", "vit_t4_liere"])
def test_liere_rotates_a_naflex_batch_on_its_cells_where_they_are_few(encoding, monkeypatch):
    """Without gradients, a NaFlex batch whose rectangle of cells holds at most CELL_GRID_RATIO times a sample's tokens
    is rotated on the rectangle (each cell's rotation serves every sample), where the per-token path gathers each
    token's own: its logits equal that path's and each image's alone (float64), padded, and with tokens dropped. The
    controls: a rectangle over the ratio, and two tokens of a sample on one cell, take the gathered path; slots moved
    by one move the logits. A batch of squares after one of mixed aspect ratios, which grew the table's rectangle, is
    rotated on its own corner of it."""
    taken = []
    on_cells = liere.LieRE.rotate_on_cells
    monkeypatch.setattr(liere.LieRE, "rotate_on_cells", lambda self, *a: taken.append(1) or on_cells(self, *a))
    same = naflex_batch([torch.randn(3, 32, 32, dtype=torch.float64) for _ in range(3)])  # 64 cells, 64 tokens
    dropped = {k: torch.cat([v[:, :64:2], v[:, 64:]], 1) for k, v in same.items()}  # 56 cells, 32 tokens
    mixed = naflex_batch([torch.randn(3, 16, 64, dtype=torch.float64), torch.randn(3, 64, 16, dtype=torch.float64)])
    twice = {k: v.clone() for k, v in same.items()}
    twice["patch_coord"][0, 1] = twice["patch_coord"][0, 0]  # two tokens of a sample on one cell
    with torch.no_grad():
        for batch, rectangle in ((same, True), (dropped, True), (mixed, False), (twice, False)):
            model = perturbed(encoding).eval()  # a rectangle of its own: a model's grows to the largest batch's
            taken.clear()
            out = model(batch)
            assert bool(taken) is rectangle
            with monkeypatch.context() as gathered:
                gathered.setattr(liere, "CELL_GRID_RATIO", 0)
                torch.testing.assert_close(out, model(batch), rtol=0, atol=1e-12)
            for i in range(len(out)):  # each image alone, its padding and dropped tokens as they are
                alone = perturbed(encoding).eval()({k: v[i : i + 1] for k, v in batch.items()})
                torch.testing.assert_close(out[i], alone[0], rtol=0, atol=1e-10)
            if batch is same:
                reference = out
        model = perturbed(encoding).eval()
        model(mixed)  # the table's rectangle grows to the mixed batch's 16 x 16 cells
        taken.clear()
        torch.testing.assert_close(model(same), reference, rtol=0, atol=1e-12)
        assert taken  # the squares are rotated on their own 8 x 8 corner of it
        grid_slots = liere.grid_slots
        monkeypatch.setattr(liere, "grid_slots", lambda *a: grid_slots(*a).roll(1, -1))  # the control: slots moved
        assert (model(same) - reference).abs().max() > 1e-3
