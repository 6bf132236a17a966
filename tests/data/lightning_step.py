"""A tiny model whose file imports Lightning, as a LightningModule's file does: benchmarks/calibrate_cpu.py measures
the resident memory Lightning's import adds to a training process with it (the `lightning` import set)."""

import lightning  # noqa: F401 - imported for its resident memory, which is what is measured
import torch
import torch.nn as nn


def tiny_step():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)), lambda n: (torch.randn(n, 64),)
