"""The test and benchmark zoo: small real architectures, each a factory that takes no arguments and
returns (model, make_batch) so that `tests/models.py:NAME` is a model reference anywhere."""

from __future__ import annotations

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
