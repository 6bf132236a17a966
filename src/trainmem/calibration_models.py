"""Tiny models `trainmem calibrate` trains in fresh processes, one per kernel family whose first use maps
more library code or JIT buffers (targets/cpu_runtime.py FAMILIES). Each factory returns (model,
make_batch) as a model file for `trainmem estimate FILE.py:factory` does; their tensors are a few KiB,
so the peak RSS of a run is the process's floor plus the family's increment."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _tokens(vocab: int, length: int):
    return lambda batch: (torch.randint(0, vocab, (batch, length)),)


def tiny_conv():
    """oneDNN's convolution forward and backward."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return model, lambda batch: (torch.randn(batch, 3, 8, 8),)


class _LstmClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.rnn = nn.LSTM(4, 4, num_layers=2, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0][:, -1])


def tiny_lstm():
    """oneDNN's LSTM (aten.mkldnn_rnn_layer and its backward)."""
    return _LstmClassifier(), _tokens(16, 4)


class _Attention(nn.Module):
    """One pre-norm GPT block (LayerNorm, causal SDPA, GELU MLP) between an embedding and a tied head: the
    kernels a transformer adds to an MLP's."""

    def __init__(self, vocab: int = 16, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        batch, length, dim = x.shape
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, dim))
        return self.head(x + self.mlp(self.norm2(x)))


def tiny_attention():
    """scaled_dot_product_attention's flash kernel for the CPU, forward and backward, in a GPT block."""
    return _Attention(), _tokens(16, 4)
