"""One attention module and one transformer block for every position encoding.

The block does not own the encoding (the model does, it is shared by all blocks); it receives the encoding
and its per-forward state at call time and calls its hooks for this layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerNorm, LayerScale, Mlp, SwiGLU, register_notrace_function
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ..encodings.base import BiasRows, BiasRowsByHand, PositionEncoding, blockwise, row_blocks

__all__ = ["BlockState", "PositionalAttention", "PositionalBlock", "encoding_attn_bias", "encoding_transform_qk"]


# The encoding hooks run as opaque calls under torch.fx (timm's feature extraction): their positional arithmetic
# depends on the grid and on per-encoding state, which symbolic tracing cannot follow. Everything else in the
# block traces normally.
@register_notrace_function
def encoding_transform_qk(encoding: PositionEncoding, layer: int, qk: torch.Tensor, x: torch.Tensor,
                          state: Any) -> torch.Tensor:
    """The encoding's q/k transform: (2, B, H, T, hd) -> (2, B, H, T, hd') with hd' >= hd."""
    return encoding.transform_qk(layer, qk, x, state)


class BlockState(NamedTuple):
    """What every block of one forward shares: the encoding's per-forward state (:meth:`PositionEncoding.prepare`)
    and which keys each query may attend (:meth:`TokenPositions.attention_mask`: padding, packed rows; None: all).
    A named tuple, so that transformers' reentrant checkpointing gets its tensors as positional leaves."""

    encoding: Any
    mask: torch.Tensor | None = None


@register_notrace_function
def encoding_attn_bias(encoding: PositionEncoding, layer: int, q: torch.Tensor, k: torch.Tensor,
                       state: Any, mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """The encoding's logit bias and the attention mask as SDPA takes them: one 4-D tensor (a 3-D float mask sends
    CPU SDPA to the math kernel, a 4-D one to the flash kernel) in q's dtype, -inf where a key is masked; the
    boolean mask alone without a bias; None without either."""
    bias = encoding.attn_bias(layer, q, k, state) if "bias" in encoding.mechanisms else None  # (H|B, ..., T, T)
    if bias is None:
        return mask
    return with_mask(bias.to(q.dtype) if bias.ndim == 4 else bias.to(q.dtype).unsqueeze(0), mask)


def with_mask(bias: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A 4-D bias with -inf where ``mask`` hides a key. With a keys-only mask (padding), a padded query's row is
    zero instead: a bias that hides keys itself (LookHere's views) could leave it no key, and its NaN would reach
    the valid tokens through its value (its output is dropped anyway)."""
    if mask is None:
        return bias
    bias = bias.masked_fill(~mask, float("-inf"))
    if mask.shape[-2] == 1:  # (B, 1, 1, T): a padded key is a padded query
        bias = bias.masked_fill(~mask.transpose(-1, -2), 0.0)
    return bias


@register_notrace_function
def encoding_bias_blocks(encoding: PositionEncoding, layer: int, q: torch.Tensor, k: torch.Tensor, state: Any,
                         mask: torch.Tensor | None) -> BiasRows | None:
    """Rows ``start:stop`` of what :func:`encoding_attn_bias` gives, one block at a time (the encoding's
    :meth:`~PositionEncoding.attn_bias_rows`, with the tensors they are differentiable in), or None where the encoding
    has no blockwise form."""
    rows = encoding.attn_bias_rows(layer, q, k, state)
    if rows is None:
        return None
    rows = rows if isinstance(rows, BiasRows) else BiasRows(rows)
    make, dtype = rows.make, q.dtype  # not rows itself: a backward under checkpointing gets the inputs made again

    def block(start: int, stop: int, *inputs: torch.Tensor) -> torch.Tensor:
        bias = make(start, stop, *inputs).to(dtype)
        bias = bias if bias.ndim == 4 else bias.unsqueeze(0)
        if mask is None:
            return bias
        if mask.shape[-2] > 1:  # a packed row's block-diagonal mask: these rows of it
            return bias.masked_fill(~mask[..., start:stop, :], float("-inf"))
        bias = bias.masked_fill(~mask, float("-inf"))  # padding, as with_mask: a padded query's row is zero
        return bias.masked_fill(~mask.transpose(-1, -2)[..., start:stop, :], 0.0)

    return BiasRows(block, rows.inputs, rows.by_hand if mask is None else None)  # by hand: no mask to add


#: query rows of a block of :class:`BlockwiseBiasAttention` at most, the blocks of one size: its passes over a block
#: then stay nearer a core's cache (ViT-S/16 448 px, batch 4, SaPE², one layer's attention and bias forward and
#: backward: 212 ms in blocks of 128 rows and one of 17, 197 ms in nine of 88; 205 ms in blocks of about 64, 224 ms
#: of 32)
BY_HAND_BLOCK_ROWS = 96
#: query rows per block of the blockwise path's inference on CPU (elsewhere
#: :data:`~pape_hub.encodings.base.BLOCK_ROWS`), the blocks of one size (``row_blocks(even=True)``: from 1,024 tokens,
#: each of 205 rows or more). torch's CPU flash-attention kernel splits a call's queries into pieces of 32 rows below
#: 192 rows, 64 from 192 and 256 from 768, each piece a matrix product with every key: a call over 128 of ViT-S/16 896
#: px's 3,137 rows took 1.44x its share of one call over all of them, 192 rows 1.17x, 256 rows 1.05x (6 heads, a mask;
#: **ad hoc**, docs/speed.md). A block's bias is twice a 128-row one's (ViT-S/16 896 px, one grid's: 19 MB)
CPU_INFERENCE_BLOCK_ROWS = 256


class BlockwiseBiasAttention(torch.autograd.Function):
    """softmax(q k^T scale + bias) v a block of query rows at a time, with the gradient of the bias too: for training
    on CPU, where no attention kernel of torch's returns one (so SDPA runs its math kernel, and blockwise each block
    was checkpointed: made twice, and differentiated through the math kernel's safe softmax; SaPE² at ViT-S/16,
    448 px, batch 4: 235 ms a layer, 199 ms a first version of this; docs/speed.md). The forward keeps each row's
    log-sum-exp, (B, H, T, 1), and no block; the backward makes each block's bias again from the :class:`BiasRows`'
    inputs, its probabilities from the log-sum-exp, and takes the gradients of q, k, v and the bias's inputs from
    them (FlashAttention's backward, by blocks of :data:`BY_HAND_BLOCK_ROWS` rows): through the encoding's
    :class:`BiasRowsByHand` where it gives one (added into the logits, no bias block, no autograd), else through
    autograd of each block of rows (:class:`BiasGradient`). A row with no key left (all of its bias -inf) gives zeros,
    as SDPA's math kernel. q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: BiasRows, scale: float,
                *inputs: torch.Tensor) -> torch.Tensor:
        queries, keys = q.contiguous(), k.mT.contiguous()  # (B, H, T, hd), (B, H, hd, T): once, not every block
        out = v.new_empty(v.shape)
        logsumexp = q.new_empty(*q.shape[:-1], 1)
        add_bias = bias_adder(bias, inputs)
        for start, stop in row_blocks(q.shape[-2], BY_HAND_BLOCK_ROWS, even=True):
            probs = add_bias(scaled_matmul(queries[:, :, start:stop], keys, scale), start, stop)
            peak = probs.amax(-1, keepdim=True)  # (B, H, rows, 1)
            peak.masked_fill_(peak == float("-inf"), 0.0)  # a row with no key: its probabilities are exp(-inf) = 0
            total = probs.sub_(peak).exp_().sum(-1, keepdim=True)
            empty = total == 0  # rows with no key: output 0, and in backward probabilities exp(-inf - inf) = 0
            out[:, :, start:stop] = torch.matmul(probs, v).div_(total.masked_fill(empty, 1.0))
            logsumexp[:, :, start:stop] = peak.add_(total.log_()).masked_fill_(empty, float("inf"))
        ctx.bias, ctx.scale = bias, scale
        ctx.save_for_backward(q, k, v, out, logsumexp, *inputs)  # q, k, v as given (views of qkv): copies would be
        return out  # held for every layer

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, logsumexp, *inputs = ctx.saved_tensors
        wanted = ctx.needs_input_grad[5:]
        bias_grad = BiasGradient(ctx.bias, inputs, wanted)
        q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.contiguous()  # once a layer
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        flat = lambda t: t.flatten(0, 1)  # noqa: E731 - (B, H, ...) -> (B * H, ...): views of contiguous tensors
        rowsum = (grad_out * out).sum(-1, keepdim=True)  # (B, H, T, 1): sum_j P_ij dP_ij
        keys, values = k.mT.contiguous(), v.mT.contiguous()  # (B, H, hd, T)
        for start, stop in row_blocks(q.shape[-2], BY_HAND_BLOCK_ROWS, even=True):
            q_rows, grad_rows = q[:, :, start:stop], grad_out[:, :, start:stop]
            probs = bias_grad.add_rows(scaled_matmul(q_rows, keys, ctx.scale), start, stop)
            probs.sub_(logsumexp[:, :, start:stop]).exp_()  # (B, H, rows, T)
            grad_logits = torch.matmul(grad_rows, values).sub_(rowsum[:, :, start:stop]).mul_(probs)
            flat(grad_v).baddbmm_(flat(probs).mT, flat(grad_rows))
            grad_q[:, :, start:stop] = scaled_matmul(grad_logits, k, ctx.scale)
            flat(grad_k).baddbmm_(flat(grad_logits).mT, flat(q_rows), alpha=ctx.scale)
            bias_grad.backward_rows(grad_logits, start, stop)
        return grad_q, grad_k, grad_v, None, None, *bias_grad.grads()


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """(B, H, n, m) @ (B, H, m, p) * scale, the scale in the matrix product (no pass of its own over the result)."""
    product = a.new_empty(*a.shape[:-1], b.shape[-1])
    return torch.baddbmm(product.flatten(0, 1), a.flatten(0, 1), b.flatten(0, 1), beta=0.0, alpha=scale,
                         out=product.flatten(0, 1)).view(product.shape)


def bias_adder(bias: BiasRows, inputs: tuple[torch.Tensor, ...]) -> Callable[[torch.Tensor, int, int], torch.Tensor]:
    """``add(logits, start, stop)``: logits (B, H, rows, T) with bias rows ``start:stop`` added in place, by the
    encoding's own :class:`BiasRowsByHand` where it has one, else from ``make``'s rows."""
    if bias.by_hand is not None:
        by_hand = bias.by_hand(*inputs)
        return lambda logits, start, stop: by_hand.add_rows(logits, start, stop) or logits
    return lambda logits, start, stop: logits.add_(bias.make(start, stop, *inputs))


class BiasGradient:
    """The backward's side of :class:`BlockwiseBiasAttention`'s bias: each block of rows made again and added into
    the logits, then the gradient of the inputs ``wanted`` from those logits' gradient: by the encoding's
    :class:`BiasRowsByHand` where it has one, else through autograd of ``make``'s rows (each block's graph freed with
    it)."""

    def __init__(self, bias: BiasRows, inputs: list[torch.Tensor], wanted: tuple[bool, ...]) -> None:
        self.make, self.wanted = bias.make, wanted
        self.by_hand: BiasRowsByHand | None = bias.by_hand(*inputs) if bias.by_hand is not None else None
        self.block: torch.Tensor | None = None
        if self.by_hand is None:  # autograd's side: leaves to differentiate each block in, and their gradients
            self.leaves = [t.detach().requires_grad_(want) for t, want in zip(inputs, wanted)]
            self.totals = [torch.zeros_like(t) if want else None for t, want in zip(inputs, wanted)]

    def add_rows(self, logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """``logits`` (B, H, rows, T) with rows ``start:stop`` of the bias added, in place."""
        if self.by_hand is not None:
            self.by_hand.add_rows(logits, start, stop)
            return logits
        with torch.enable_grad():
            self.block = self.make(start, stop, *self.leaves)
        if self.block.requires_grad and not any(self.wanted):
            raise RuntimeError("blockwise attention's bias rows need gradients from tensors they do not name: "
                               "return a BiasRows(make, inputs) from attn_bias_rows, with make reading only inputs")
        return logits.add_(self.block.detach())

    def backward_rows(self, grad_logits: torch.Tensor, start: int, stop: int) -> None:
        """Adds the gradient of rows ``start:stop`` (their logits' gradient (B, H, rows, T)) to the inputs'."""
        if self.by_hand is not None:
            self.by_hand.backward_rows(grad_logits, start, stop)
            return
        block, self.block = self.block, None
        if not block.requires_grad:
            return
        needed = [leaf for leaf in self.leaves if leaf.requires_grad]
        grads = iter(torch.autograd.grad(block, needed, grad_logits.sum_to_size(block.shape), allow_unused=True))
        for total, want in zip(self.totals, self.wanted):
            grad = next(grads) if want else None
            if grad is not None:
                total.add_(grad)

    def grads(self) -> tuple[torch.Tensor | None, ...]:
        """Each input's gradient (None where not wanted)."""
        if self.by_hand is None:
            return tuple(self.totals)
        return tuple(grad if want else None for grad, want in zip(self.by_hand.grads(), self.wanted))


def bias_gradient_by_hand(q: torch.Tensor, dropout: float) -> bool:
    """Whether blockwise attention in training takes :class:`BlockwiseBiasAttention`: on CPU in float32 / float64
    (autocast's bfloat16 and dropout stay with SDPA, each block checkpointed; on a GPU SDPA's kernels return the bias's
    gradient themselves)."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and dropout == 0.0


@register_notrace_function
def pad_to_width(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """v zero-padded on its last axis to ``like``'s width (queries and keys widened by the encoding)."""
    width = like.shape[-1]
    return F.pad(v, (0, width - v.shape[-1])) if width != v.shape[-1] else v


class PositionalAttention(nn.Module):
    """Multi-head self-attention whose q/k transform and logit bias come from a :class:`PositionEncoding`.

    ``fused_attn`` (default) runs ``F.scaled_dot_product_attention``; the eager path computes the same
    softmax by hand and can return the attention probabilities. The encoding transforms queries and keys together
    (``qkv[:2]``, a view: no copy) and may widen them (PaPE's augmentation; on a GPU padded to a multiple of 8);
    v is then zero-padded to their width and the output sliced back, so CPU and GPU fused kernels, which want one
    head width, still apply. The softmax scale stays head_dim^-1/2.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        layer_idx: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = LayerNorm,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.layer_idx = layer_idx
        self.fused_attn = True
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: torch.Tensor, encoding: PositionEncoding, state: BlockState | Any, output_attentions: bool = False,
        fused: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, D) normed tokens; ``state``: the forward's :class:`BlockState` (or the encoding's state alone).
        Returns (B, T, D) and, if asked, the (B, H, T, T) probabilities. The fused kernel runs unless
        ``fused=False`` (this call), ``fused_attn=False`` (timm's module switch) or the probabilities are asked
        for."""
        state, mask = state if isinstance(state, BlockState) else (state, None)
        B, T, D = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        qk, v = qkv[:2], qkv[2]
        if not isinstance(self.q_norm, nn.Identity):
            qk = torch.stack([self.q_norm(qk[0]), self.k_norm(qk[1])])
        if "qk" in encoding.mechanisms:
            qk = encoding_transform_qk(encoding, self.layer_idx, qk, x, state)  # (2, B, H, T, hd), or wider (PaPE)
        q, k = qk.unbind(0)
        fused = fused and self.fused_attn and not output_attentions
        # no (heads, T, T) tensor on long sequences; in training, counted by the bias's own leading size (a mask
        # makes a bias per sample; without one the encoding says whether the batch shares one)
        if fused and "bias" in encoding.mechanisms and blockwise(
                T, self.num_heads * (B if mask is not None else encoding.bias_batch(state, B))):
            blocks = encoding_bias_blocks(encoding, self.layer_idx, q, k, state, mask)
            if blocks is not None:
                out = self.blockwise(q, k, v, blocks).transpose(1, 2).reshape(B, T, D)
                return self.proj_drop(self.proj(out)), None
        bias = encoding_attn_bias(encoding, self.layer_idx, q, k, state, mask) \
            if mask is not None or "bias" in encoding.mechanisms else None  # float bias, boolean mask, or None

        if fused:
            out = F.scaled_dot_product_attention(
                q, k, pad_to_width(v, q), attn_mask=bias, dropout_p=self.attn_drop.p if self.training else 0.0,
                scale=self.scale,
            )[..., : self.head_dim]
            probs = None
        else:
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, T, T)
            if bias is not None:
                logits = logits.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else logits + bias
            probs = logits.softmax(dim=-1)
            out = self.attn_drop(probs) @ v
        out = out.transpose(1, 2).reshape(B, T, D)
        return self.proj_drop(self.proj(out)), probs


    def blockwise(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: BiasRows) -> torch.Tensor:
        """Fused attention one block of query rows at a time (:data:`BLOCK_ROWS`; for inference on CPU
        :data:`CPU_INFERENCE_BLOCK_ROWS`), each with its rows of the bias:
        exact (softmax rows are independent), and no block holds more than (heads, rows, T). With gradients, on CPU
        :class:`BlockwiseBiasAttention` (no block kept, the bias's gradient by hand); elsewhere each block is recomputed
        in backward (checkpointed). Either way training holds no (heads, T, T) tensor. Without gradients, each block's
        output is written straight into the layer's: kept in a list until a final ``cat``, the small outputs sat
        between the blocks' freed biases on glibc's heap, which then could not reuse or return them (ViT-S/16 at
        896 px, LookHere: 287-296 MB resident for one forward, 119-136 MB written in place; `ape` 90-140 MB).
        (B, H, T, hd') -> (B, H, T, hd)."""
        v = pad_to_width(v, q)
        dropout = self.attn_drop.p if self.training else 0.0

        def attend(start: int, stop: int) -> torch.Tensor:  # (B, H, stop - start, hd')
            return F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=blocks(start, stop),
                                                  dropout_p=dropout, scale=self.scale)

        if torch.is_grad_enabled() and bias_gradient_by_hand(q, dropout):
            return BlockwiseBiasAttention.apply(q, k, v, blocks, self.scale, *blocks.inputs)[..., : self.head_dim]
        if torch.is_grad_enabled():
            out = [checkpoint(attend, start, stop, use_reentrant=False) for start, stop in row_blocks(q.shape[-2])]
            return torch.cat(out, dim=2)[..., : self.head_dim]
        cpu = q.device.type == "cpu"
        (start, stop), *rest = row_blocks(q.shape[-2], CPU_INFERENCE_BLOCK_ROWS if cpu else None, even=cpu)
        first = attend(start, stop)
        whole = first.new_empty(*first.shape[:2], q.shape[-2], first.shape[-1])  # in the dtype attention gives
        whole[:, :, start:stop] = first  # (autocast)
        del first
        for start, stop in rest:
            whole[:, :, start:stop] = attend(start, stop)
        return whole[..., : self.head_dim]


class PositionalBlock(nn.Module):
    """Pre-norm transformer block (timm's ``Block``) around :class:`PositionalAttention`.

    ``init_values`` adds timm's ``LayerScale`` (CaiT / DeiT-III: a learned per-channel gain on each residual
    branch, started at ``init_values``; keys ``ls1.gamma`` / ``ls2.gamma`` as in timm's ViT); None leaves it out.
    ``swiglu_mlp`` replaces the GELU MLP by timm's ``SwiGLU`` (``silu(fc1_g x) * fc1_x x -> fc2``, hidden width
    rounded up to a multiple of 8), as timm's Eva builds DINOv3's S+ / H+ blocks (same name, same keys).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        layer_idx: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = LayerNorm,
        swiglu_mlp: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = PositionalAttention(
            dim, num_heads, layer_idx, qkv_bias=qkv_bias, qk_norm=qk_norm, attn_drop=attn_drop,
            proj_drop=proj_drop, norm_layer=norm_layer,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = SwiGLU(dim, int(dim * mlp_ratio), drop=proj_drop, align_to=8) if swiglu_mlp else \
            Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, x: torch.Tensor, encoding: PositionEncoding, state: Any, output_attentions: bool = False,
        fused: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn_out, probs = self.attn(self.norm1(x), encoding, state, output_attentions, fused)
        x = x + self.drop_path1(self.ls1(attn_out))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x, probs
