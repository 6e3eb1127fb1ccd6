"""RNNLM, GNMT-like NMT and a GPT-2-size transformer, written here (no pretrained weights).

The recurrent models unroll ``nn.LSTMCell`` over time in Python, so every time step of every layer
becomes its own ops in the traced graph (as in the TensorFlow graphs the placement papers used,
where each step was a separate op a placer could move).
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RNNLM", "NMT", "GPT2"]


class RNNLM(nn.Module):
    """Stacked LSTM language model: embedding, ``layers`` LSTM layers unrolled over ``steps``,
    a softmax over the vocabulary at every step (Zaremba et al. 2014, "Recurrent Neural Network
    Regularization"; the Post paper uses a 4-layer version)."""

    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cells = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens):  # tokens: [batch, steps]
        b = tokens.shape[0]
        x = self.embed(tokens)
        state = [(x.new_zeros(b, c.hidden_size), x.new_zeros(b, c.hidden_size)) for c in self.cells]
        outs = []
        for t in range(tokens.shape[1]):
            h = x[:, t]
            for i, cell in enumerate(self.cells):
                state[i] = cell(h, state[i])
                h = state[i][0]
            outs.append(h)
        return self.out(torch.stack(outs, 1))  # [batch, steps, vocab]


class NMT(nn.Module):
    """GNMT-like encoder-decoder with attention (Wu et al. 2016, "Google's Neural Machine Translation
    System", Sec. 3): the first encoder layer is bidirectional, residual connections from the third
    layer up, additive attention queried by the bottom decoder layer, its context fed to every decoder
    layer above and to the softmax. ``layers`` counts encoder layers and decoder layers each."""

    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, hidden)
        self.tgt_embed = nn.Embedding(vocab, hidden)
        self.fwd = nn.LSTMCell(hidden, hidden)
        self.bwd = nn.LSTMCell(hidden, hidden)
        self.enc = nn.ModuleList(nn.LSTMCell(2 * hidden if i == 0 else hidden, hidden) for i in range(layers - 1))
        self.dec = nn.ModuleList(nn.LSTMCell(hidden if i == 0 else 2 * hidden, hidden) for i in range(layers))
        self.att_q = nn.Linear(hidden, hidden, bias=False)
        self.att_k = nn.Linear(hidden, hidden, bias=False)
        self.att_v = nn.Linear(hidden, 1, bias=False)
        self.out = nn.Linear(2 * hidden, vocab)

    @staticmethod
    def _run(cell, xs, reverse=False):
        b = xs[0].shape[0]
        s = (xs[0].new_zeros(b, cell.hidden_size), xs[0].new_zeros(b, cell.hidden_size))
        hs = []
        for x in reversed(xs) if reverse else xs:
            s = cell(x, s)
            hs.append(s[0])
        return hs[::-1] if reverse else hs

    def forward(self, src, tgt):  # [batch, src_len], [batch, tgt_len]
        e = self.src_embed(src)
        xs = [e[:, t] for t in range(src.shape[1])]
        hs = [torch.cat(p, 1) for p in zip(self._run(self.fwd, xs), self._run(self.bwd, xs, reverse=True), strict=True)]
        for i, cell in enumerate(self.enc):
            ys = self._run(cell, hs)
            hs = [y + h for y, h in zip(ys, hs, strict=True)] if i >= 1 else ys  # residual from layer 3 up
        memory = torch.stack(hs, 1)  # [batch, src_len, hidden]
        keys = self.att_k(memory)
        d = self.tgt_embed(tgt)
        b = tgt.shape[0]
        states = [(d.new_zeros(b, c.hidden_size), d.new_zeros(b, c.hidden_size)) for c in self.dec]
        outs = []
        for t in range(tgt.shape[1]):
            states[0] = self.dec[0](d[:, t], states[0])
            h = states[0][0]
            score = self.att_v(torch.tanh(keys + self.att_q(h).unsqueeze(1))).squeeze(2)
            ctx = torch.bmm(torch.softmax(score, 1).unsqueeze(1), memory).squeeze(1)
            for i in range(1, len(self.dec)):
                states[i] = self.dec[i](torch.cat([h, ctx], 1), states[i])
                h = states[i][0] + h if i >= 2 else states[i][0]
            outs.append(torch.cat([h, ctx], 1))
        return self.out(torch.stack(outs, 1))


class _Block(nn.Module):
    """Pre-norm transformer block: causal multi-head self-attention, then a 4x GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, 2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = torch.softmax(att.masked_fill(mask[:t, :t], float("-inf")), -1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT2(nn.Module):
    """GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2 and
    the released ``124M`` config): learned positions, pre-norm blocks, tied input/output embedding."""

    def __init__(self, vocab, d, layers, heads, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, device=tokens.device))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.ln(x) @ self.wte.weight.t()
