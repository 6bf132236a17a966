"""The test and benchmark zoo: small real architectures, each a factory that takes no arguments and
returns (model, make_batch) so that `tests/models.py:NAME` is a model reference anywhere."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def _images(channels: int, size: int):
    return lambda batch: (torch.randn(batch, channels, size, size),)


def _tokens(vocab: int, length: int):
    return lambda batch: (torch.randint(0, vocab, (batch, length)),)


def cnn_bn():
    """A VGG-style CNN with BatchNorm for 3×64×64 images, 10 classes."""
    def stage(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
    model = nn.Sequential(*stage(3, 32), *stage(32, 64), *stage(64, 128), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(128, 10))
    return model, _images(3, 64)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNetSmall(nn.Module):
    """ResNet-18-style residual net at reduced width for 3×64×64 images."""

    def __init__(self, width: int = 32, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        widths = [width, width * 2, width * 4, width * 8]
        blocks, cin = [], width
        for index, cout in enumerate(widths):
            stride = 1 if index == 0 else 2
            blocks += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.ModuleList(blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.layers:
            x = block(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet_small():
    return ResNetSmall(), _images(3, 64)


class TinyGPT(nn.Module):
    """A GPT-style decoder LM: token + position embeddings, pre-norm blocks with causal
    scaled_dot_product_attention and a GELU MLP, a tied LM head."""

    def __init__(self, vocab=2000, d_model=256, heads=4, layers=4, seq=128):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(_GPTBlock(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class _GPTBlock(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, length, d))
        return x + self.mlp(self.norm2(x))


def tiny_gpt():
    return TinyGPT(), _tokens(2000, 128)


def transformer_encoder():
    """nn.TransformerEncoder classifier (its layers are deep-copied clones of one layer)."""
    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5000, 128)
            layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.1, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
            self.head = nn.Linear(128, 5)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)).mean(dim=1))
    return Classifier(), _tokens(5000, 96)


class LSTMClassifier(nn.Module):
    def __init__(self, cell=nn.LSTM, vocab=10000, dim=128, hidden=256, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = cell(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0][:, -1])


def lstm():
    return LSTMClassifier(nn.LSTM), _tokens(10000, 64)


def gru():
    return LSTMClassifier(nn.GRU), _tokens(10000, 64)


class UNetSmall(nn.Module):
    """A two-level U-Net: conv blocks, max-pool down, transposed-conv up, skip concatenations."""

    def __init__(self, base=16, classes=3):
        super().__init__()
        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())
        self.down1, self.down2 = block(3, base), block(base, base * 2)
        self.bottom = block(base * 2, base * 4)
        self.up2 = nn.ConvTranspose2d(base * 4, base * 2, 2, stride=2)
        self.dec2 = block(base * 4, base * 2)
        self.up1 = nn.ConvTranspose2d(base * 2, base, 2, stride=2)
        self.dec1 = block(base * 2, base)
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        bottom = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(bottom), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.out(u1)


def unet():
    return UNetSmall(), _images(3, 96)


def frozen_backbone():
    """A CNN backbone whose parameters are frozen, with a trainable head: no grads, no state for it."""
    backbone, _ = cnn_bn()
    for parameter in backbone[:-1].parameters():
        parameter.requires_grad_(False)
    return backbone, _images(3, 64)


def conv3d_net():
    """A small 3D CNN for video clips 3×8×32×32: exercises the slow_conv3d path on the CPU."""
    model = nn.Sequential(nn.Conv3d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2),
                          nn.Conv3d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    return model, lambda batch: (torch.randn(batch, 3, 8, 32, 32),)


def mobilenet_like():
    """Depthwise-separable convolutions with BatchNorm and ReLU6."""
    def separable(cin, cout, stride):
        return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()]
    model = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6(),
                          *separable(32, 64, 1), *separable(64, 128, 2), *separable(128, 256, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(256, 10))
    return model, _images(3, 96)


# ---- tiny models for calibrating the process floor (benchmarks/calibrate_cpu.py) -------------------

def tiny_conv():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)), _images(3, 8)


def tiny_lstm():
    return LSTMClassifier(nn.LSTM, vocab=16, dim=4, hidden=4, classes=2), _tokens(16, 4)


def tiny_attention():
    return TinyGPT(vocab=16, d_model=8, heads=2, layers=1, seq=4), _tokens(16, 4)


def gpt_1b3():
    """GPT-style 1.3B: 24 layers, d_model 2048, 16 heads, seq 1024, vocab 50257 (benchmarks/speed.py)."""
    return TinyGPT(vocab=50257, d_model=2048, heads=16, layers=24, seq=1024), _tokens(50257, 1024)


# ---- held-out families (issue 9): each exercises a kernel or a pattern the zoo above does not --------

class _InvertedResidual(nn.Module):
    """MobileNetV2's block: 1×1 expand, 3×3 depthwise, 1×1 project, with GroupNorm instead of BatchNorm."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4, groups: int = 8) -> None:
        super().__init__()
        hidden = cin * expand
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.GroupNorm(groups, hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.GroupNorm(groups, hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.GroupNorm(groups, cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return x + out if self.residual else out


def depthwise_gn():
    """Depthwise and grouped convolutions with GroupNorm (MobileNetV2-style) for 3×64×64 images."""
    widths = [(16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.GroupNorm(4, 16), nn.ReLU6(),
                          *[_InvertedResidual(cin, cout, s) for cin, cout, s in widths],
                          nn.Conv2d(64, 256, 1, groups=4, bias=False), nn.GroupNorm(8, 256), nn.ReLU6(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
    return model, _images(3, 64)


def conv_autoencoder():
    """A convolutional autoencoder (strided Conv2d down, ConvTranspose2d up) trained with MSE on its input."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(),
        nn.ConvTranspose2d(32, 3, 4, 2, 1), nn.Sigmoid())
    return model, _images(3, 64), lambda output, inputs: F.mse_loss(output, inputs[0])


class _BiGRUClassifier(nn.Module):
    def __init__(self, vocab=8000, dim=128, hidden=192, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0].mean(dim=1))


def bigru():
    """A two-layer bidirectional GRU text classifier, mean-pooled over 64 tokens."""
    return _BiGRUClassifier(), _tokens(8000, 64)


class _BagRecommender(nn.Module):
    """DLRM-style: three sparse features through EmbeddingBag (two multi-hot [batch, bag] sums, one
    ragged bag list with offsets, mean), concatenated with dense features into an MLP click score."""

    def __init__(self, rows=50000, dim=64, dense=13):
        super().__init__()
        self.user = nn.EmbeddingBag(rows, dim, mode="sum")
        self.item = nn.EmbeddingBag(rows, dim, mode="sum")
        self.history = nn.EmbeddingBag(rows, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(3 * dim + dense, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, user, item, history, offsets, dense):
        features = [self.user(user), self.item(item), self.history(history, offsets), dense]
        return self.mlp(torch.cat(features, dim=1))


def embbag_recsys():
    """An EmbeddingBag recommender (dense gradients) scored with binary cross-entropy."""
    def make_batch(batch):
        return (torch.randint(0, 50000, (batch, 20)), torch.randint(0, 50000, (batch, 10)),
                torch.randint(0, 50000, (batch * 30,)), torch.arange(0, batch * 30, 30), torch.randn(batch, 13))
    return (_BagRecommender(), make_batch,
            lambda output, inputs: F.binary_cross_entropy(torch.sigmoid(output), torch.ones_like(output)))


class _AttentionBlock(nn.Module):
    """Pre-norm encoder block; attention written with einsum (scores and weighted sum) or through SDPA."""

    def __init__(self, d_model: int, heads: int, einsum: bool) -> None:
        super().__init__()
        self.heads, self.einsum = heads, einsum
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.heads, d // self.heads).unbind(2)
        if self.einsum:
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // self.heads)
            attention = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)
        else:
            attention = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        x = x + self.proj(attention.reshape(b, length, d))
        return x + self.mlp(self.norm2(x))


def einsum_attention():
    """A 4-layer encoder classifier whose layers alternate einsum attention and SDPA (non-causal)."""
    class Encoder(nn.Module):
        def __init__(self, vocab=4000, d_model=192, heads=6, layers=4, seq=128):
            super().__init__()
            self.embed, self.positions = nn.Embedding(vocab, d_model), nn.Parameter(torch.zeros(seq, d_model))
            self.blocks = nn.ModuleList(_AttentionBlock(d_model, heads, einsum=i % 2 == 0) for i in range(layers))
            self.head = nn.Linear(d_model, 10)

        def forward(self, ids):
            x = self.embed(ids) + self.positions[: ids.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean(dim=1))
    return Encoder(), _tokens(4000, 128)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class _LlamaBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = _RMSNorm(d_model), _RMSNorm(d_model)
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.gate, self.up = nn.Linear(d_model, hidden, bias=False), nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x, cos, sin):
        b, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, length, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class _TiedLM(nn.Module):
    """Llama-style decoder: RMSNorm, rotary positions, SwiGLU, no biases; the LM head shares the embedding."""

    def __init__(self, vocab=4000, d_model=256, heads=4, layers=4, seq=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(_LlamaBlock(d_model, heads, 688) for _ in range(layers))
        self.norm = _RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.embed.weight
        angles = torch.outer(torch.arange(seq).float(), 10000.0 ** (-torch.arange(0, d_model // heads, 2).float() / (d_model // heads)))
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()], dim=-1), persistent=False)

    def forward(self, ids):
        x = self.embed(ids)
        cos, sin = self.cos[: ids.shape[1]], self.sin[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.lm_head(self.norm(x))


def tied_lm():
    """A weight-tied Llama-style LM, next-token cross-entropy over 128 tokens."""
    def loss_fn(logits, inputs):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), inputs[0][:, 1:].reshape(-1))
    return _TiedLM(), _tokens(4000, 128), loss_fn


class _TokenMaskMoE(nn.Module):
    """An eager top-1 (Switch-style) mixture of experts: each expert takes `torch.where(idx == e)`, a 1-D
    token mask, and its outputs are added back with index_add."""

    def __init__(self, d_model: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.num_experts = experts
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))
                                     for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weight, idx = self.router(flat).softmax(dim=-1).max(dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tokens = torch.where(idx == e)[0]
            out = out.index_add(0, tokens, expert(flat[tokens]) * weight[tokens, None])
        return out.view_as(x)


def moe_token_mask():
    """Token embeddings through two residual top-1 MoE layers (8 experts) and a classifier head."""
    class Model(nn.Module):
        def __init__(self, vocab=4000, d_model=128, layers=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
            self.moes = nn.ModuleList(_TokenMaskMoE(d_model, 512, 8) for _ in range(layers))
            self.head = nn.Linear(d_model, 10)

        def forward(self, ids):
            x = self.embed(ids)
            for norm, moe in zip(self.norms, self.moes):
                x = x + moe(norm(x))
            return self.head(x.mean(dim=1))
    return Model(), _tokens(4000, 64)


class _PackedTagger(nn.Module):
    """Padded token sequences through pack_padded_sequence, a recurrent layer, and back (pad_packed_sequence),
    as a sequence tagger over sentences of different lengths is written."""

    def __init__(self, cell: type, batch_first: bool, vocab: int = 2000, hidden: int = 128) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(vocab, 64)
        self.rnn = cell(64, hidden, batch_first=batch_first, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 12)

    def forward(self, tokens, lengths):
        x = self.embed(tokens)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=self.batch_first, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=self.batch_first,
                                                  total_length=tokens.shape[1 if self.batch_first else 0])
        return self.head(out)


def _tag_loss(logits, inputs):
    return logits.float().pow(2).mean()


def packed_lstm_tagger():
    """A bidirectional LSTM tagger over packed sequences (batch first), every sentence at the padded length 60."""
    return (_PackedTagger(nn.LSTM, batch_first=True),
            lambda batch: (torch.randint(0, 2000, (batch, 60)), torch.full((batch,), 60)), _tag_loss)


def packed_gru_tagger():
    """A bidirectional GRU tagger over packed sequences (time first), sentences of 5 to 60 tokens."""
    return (_PackedTagger(nn.GRU, batch_first=False),
            lambda batch: (torch.randint(0, 2000, (60, batch)), torch.randint(5, 61, (batch,))), _tag_loss)


# sentence lengths of a batch of 16, longest first: a fixed batch, so that `--seq-lengths` with them is the run
TAGGER_LENGTHS = (60, 57, 52, 47, 44, 40, 33, 30, 28, 25, 21, 17, 14, 11, 8, 5)


def packed_lstm_fixed_lengths():
    """The LSTM tagger over packed sequences, the batch's sentences of TAGGER_LENGTHS (up to 16 per batch)."""
    return (_PackedTagger(nn.LSTM, batch_first=True),
            lambda batch: (torch.randint(0, 2000, (batch, 60)), torch.tensor(TAGGER_LENGTHS[:batch])), _tag_loss)


# ---- repeated blocks (trace/block_reuse.py composes a trace from a few of them) ---------------------------

def gpt_deep():
    """TinyGPT with 6 blocks: a stack deep enough to compose (block_reuse.MIN_BLOCKS lowered by the tests)."""
    return TinyGPT(vocab=500, d_model=64, heads=4, layers=6, seq=32), _tokens(500, 32)


def _features(width: int):
    return lambda batch: (torch.randn(batch, width),)


class _CountedBlock(nn.Module):
    """A block whose forward reads its own index: from the fourth (index 3) on it keeps an extra tensor."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.layer_idx = index  # an index under an index's name: not a setting (block_variants.INDEX_NAMES)

    def forward(self, x):
        y = self.linear(x)
        return y * torch.sigmoid(y) if self.layer_idx >= 3 else y


class _BlockStack(nn.Module):
    def __init__(self, blocks) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def index_dependent_stack():
    return _BlockStack(_CountedBlock(i) for i in range(6)), _features(32)


def windowed_stack():
    """Blocks alike in parameters whose settings differ (a sliding window on every other block)."""
    blocks = [nn.Linear(32, 32) for _ in range(6)]
    for index, block in enumerate(blocks):
        block.window = 8 if index % 2 else None
    return _BlockStack(blocks), _features(32)


def _deepened(built, blocks: int = 6):
    """A zoo factory's model with its outermost ModuleList grown to `blocks` by copies of its last block."""
    import copy

    model = built[0]
    lists = [m for _, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    stack = lists[0]
    while len(stack) < blocks:
        stack.append(copy.deepcopy(stack[len(stack) - 1]))
    if hasattr(model, "encoder") and hasattr(model.encoder, "num_layers"):
        model.encoder.num_layers = blocks  # nn.TransformerEncoder keeps its count
    return (model, *built[1:])


def tied_lm_deep():
    return _deepened(tied_lm())


def transformer_encoder_deep():
    return _deepened(transformer_encoder())


def einsum_attention_deep():
    """Blocks that alternate einsum attention and SDPA: their settings differ, so they are not composed."""
    return _deepened(einsum_attention())


def mistral_deep():
    """A 6-layer Mistral from transformers, as a script calls it (use_cache left on): its DynamicCache makes one
    8-byte sliding-window tensor per layer at the model's level (trace/block_compose.py, 5.)."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16, max_position_embeddings=64)

    def loss_fn(out, inputs):
        return out.logits.float().mean()
    return MistralForCausalLM(config), _tokens(256, 32), loss_fn


def gemma2_deep():
    """A 10-layer Gemma-2 from transformers: sliding and global attention layers alternate (block_reuse.py)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=10, head_dim=16,
                          num_attention_heads=4, num_key_value_heads=2, sliding_window=16, max_position_embeddings=64)

    def loss_fn(out, inputs):
        return out.logits.float().mean()
    return Gemma2ForCausalLM(config), _tokens(256, 32), loss_fn


def mixtral_deep():
    """A 6-layer Mixtral (4 experts, top-2) from transformers in bf16, as its grouped expert matmul needs: its router's
    gradient is summed in backward outside every module (trace/block_compose.py, 5.)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64)

    def loss_fn(out, inputs):
        return out.logits.float().mean()
    return MixtralForCausalLM(config).to(torch.bfloat16), _tokens(256, 32), loss_fn
