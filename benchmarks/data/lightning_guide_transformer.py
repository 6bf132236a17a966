"""The model of Lightning's FSDP guide (docs/source-pytorch/advanced/model_parallel/fsdp.rst, Lightning 2.1): the
Transformer of `lightning.pytorch.demos` built with vocab_size=33,278 (WikiText2's), nlayers=32, nhid=4096, ninp=1024,
nhead=64 ("1B parameters"), trained on WikiText2 blocks of 35 tokens with `DataLoader(dataset)` (batch 1),
`F.nll_loss(output, target.view(-1))` and `torch.optim.Adam(lr=0.1)`.

Written here from that architecture (src/lightning/pytorch/demos/transformer.py), with what moves memory kept as the
demo has it: the positional table (5000 x ninp, fp32) is made on the input's device at the first forward and kept as a
plain attribute, not a buffer, so FSDP never shards it; the sum `x + pe[...]` is computed and discarded (the demo's
own line), so the embeddings reach the transformer without it; the causal mask is made in each forward.

    trainmem estimate benchmarks/data/lightning_guide_transformer.py:guide_transformer --strategy fsdp1 ...
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 33278  # len(WikiText2().dictionary) of the demo's training text
BLOCK = 35  # WikiText2(block_size=35)


class PositionalEncoding(nn.Module):
    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pe is None:
            self.pe = self._table(x.device)
        x + self.pe[: x.size(0), :]  # noqa: B018 - the demo's own line: the sum is made and dropped
        return self.dropout(x)

    def _table(self, device: torch.device) -> torch.Tensor:
        pe = torch.zeros(self.max_len, self.dim, device=device)
        position = torch.arange(0, self.max_len, dtype=torch.float, device=device).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        return pe.unsqueeze(0).transpose(0, 1)


class Transformer(nn.Module):
    def __init__(self, vocab_size: int = VOCAB, ninp: int = 200, nhead: int = 2, nhid: int = 200, nlayers: int = 2,
                 dropout: float = 0.2) -> None:
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid, dropout=dropout,
                                          batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _, t = inputs.shape
        mask = torch.tril(torch.ones(t, t, device=inputs.device)) == 1
        mask = mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)
        src = self.pos_encoder(self.embedding(inputs) * math.sqrt(self.ninp))
        target = self.pos_encoder(self.embedding(target) * math.sqrt(self.ninp))
        output = self.transformer(src, target, tgt_mask=mask)
        output = self.decoder(output)
        output = F.log_softmax(output, dim=-1)
        return output.view(-1, self.vocab_size)


def _batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randint(0, VOCAB, (batch_size, BLOCK)), torch.randint(0, VOCAB, (batch_size, BLOCK)))


def _loss(output: torch.Tensor, inputs: tuple, *targets) -> torch.Tensor:
    return F.nll_loss(output, inputs[1].reshape(-1))


def guide_transformer():
    """The guide's 1B model with its batch (inputs, shifted targets) and loss."""
    return Transformer(vocab_size=VOCAB, nlayers=32, nhid=4096, ninp=1024, nhead=64), _batch, _loss
