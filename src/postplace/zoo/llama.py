"""A LLaMA-style decoder-only transformer, written here (no pretrained weights, no library model).

The architecture is the one Touvron et al. describe in "LLaMA: Open and Efficient Foundation
Language Models" (2023, Sec. 2.2): a GPT-like stack of pre-norm blocks in which LayerNorm becomes
RMSNorm (Zhang & Sennrich 2019), the MLP is a SwiGLU gate (Shazeer 2020) of hidden width ``ffn``,
and learned absolute positions give way to rotary embeddings applied to queries and keys (RoPE, Su
et al. 2021). "Llama 2" (Touvron et al. 2023b) keeps that block and, for its larger models, lets
several query heads share one key/value head (grouped-query attention, Ainslie et al. 2023); Llama
3.2 1B uses grouped-query attention too (32 query heads over 8 key/value heads). No linear layer has
a bias.

Our choices, where the models differ or we simplify: the output head is a separate matrix (Llama 2
keeps it separate; Llama 3.2 1B ties it to the embedding, which our ``1b`` size does not), RoPE
rotates the two halves of each head (the pairing of dimensions is a fixed permutation of the head and
changes no shape or FLOP), and Llama 3's scaling of the rotary frequencies for long contexts is left
out (it changes values only, never the graph).

Attention calls ``scaled_dot_product_attention(..., is_causal=True)``. Traced on (fake) CPU tensors
it is one fused op, ``_scaled_dot_product_flash_attention_for_cpu`` and its backward, whose FLOPs
:mod:`postplace.graph.flops` counts; on tensors that stay on the meta device torch lowers it to its
reference ops instead (a causal mask, batched products, a softmax), so the zoo's 1B and 7B sizes,
built on the meta device, give the fused op only where the tracer fakes meta tensors as CPU ones.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Llama", "RMSNorm"]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension: LayerNorm without the mean
    subtraction and without a bias (Zhang & Sennrich 2019)."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x, cos, sin):
    """Rotary embedding: each pair (x[i], x[i + half]) of a head turned by the angle of its position
    and frequency. ``x``: [batch, heads, seq, head_dim]; ``cos``, ``sin``: [seq, head_dim / 2]."""
    a, b = x.chunk(2, -1)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1)


class _Attention(nn.Module):
    """Causal grouped-query self-attention: ``heads`` query heads, ``kv_heads`` key/value heads, each
    key/value head serving ``heads // kv_heads`` consecutive query heads."""

    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        if d % heads or heads % kv_heads:
            raise ValueError(f"d {d} must divide into {heads} heads, and heads into {kv_heads} kv heads")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.wq = nn.Linear(d, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h, kv, hd = self.heads, self.kv_heads, self.head_dim
        q = self.wq(x).view(b, t, h, hd).transpose(1, 2)
        k = self.wk(x).view(b, t, kv, hd).transpose(1, 2)
        v = self.wv(x).view(b, t, kv, hd).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if kv != h:  # share: kv head j serves query heads j*g .. j*g + g - 1
            g = h // kv
            k = k[:, :, None].expand(b, kv, g, t, hd).reshape(b, h, t, hd)
            v = v[:, :, None].expand(b, kv, g, t, hd).reshape(b, h, t, hd)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, h * hd))


class _SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``: a gated MLP of hidden width ``ffn`` (Shazeer 2020)."""

    def __init__(self, d: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(d, ffn, bias=False)  # gate
        self.w3 = nn.Linear(d, ffn, bias=False)  # up
        self.w2 = nn.Linear(ffn, d, bias=False)  # down

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class _LlamaBlock(nn.Module):
    """RMSNorm -> attention -> residual, RMSNorm -> SwiGLU MLP -> residual."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, eps: float):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.attn = _Attention(d, heads, kv_heads)
        self.mlp = _SwiGLU(d, ffn)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """LLaMA-style decoder: token embedding, ``layers`` blocks, a final RMSNorm and an untied output
    head; ``forward(tokens [batch, seq]) -> logits [batch, seq, vocab]`` for ``seq <= context``.

    The rotary angles (``cos``/``sin``, [context, head_dim / 2]) are non-persistent buffers computed
    once here, so the model builds on the meta device like any other (their values are then unset,
    which tracing never reads)."""

    def __init__(
        self,
        vocab: int,
        d: int,
        layers: int,
        heads: int,
        kv_heads: int,
        ffn: int,
        context: int,
        theta: float = 10000.0,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_LlamaBlock(d, heads, kv_heads, ffn, eps) for _ in range(layers))
        self.norm = RMSNorm(d, eps)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)  # [hd / 2]
        angle = torch.arange(context, dtype=torch.float32)[:, None] * freq  # [context, hd / 2]
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))
