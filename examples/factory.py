"""A model factory: `trainmem estimate examples/factory.py:small_cnn --input-shape 3,224,224`.

A factory takes no arguments and returns an nn.Module (the batch is then made from --input-shape), or
`(module, make_batch[, loss_fn])`, or `{"model": …, "make_batch": …, "loss_fn": …}`; see
`examples/factory.py:tiny_classifier` and tests/models.py for those forms.
"""

import torch
import torch.nn as nn


def _block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU())


def small_cnn() -> nn.Module:
    """Four strided conv blocks and a linear head: any image size (adaptive pooling), ten classes."""
    return nn.Sequential(_block(3, 16), _block(16, 32), _block(32, 64), _block(64, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def tiny_classifier():
    """The tuple form: the model, how to make a batch of inputs, and the loss (here sequence classification
    over token ids): `trainmem estimate examples/factory.py:tiny_classifier --batch-size 32`."""
    vocab, length, classes = 1000, 128, 4
    model = nn.Sequential(nn.Embedding(vocab, 64), nn.Flatten(), nn.Linear(64 * length, classes))

    def make_batch(batch_size: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch_size, length))

    def loss_fn(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        targets = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
        return nn.functional.cross_entropy(output, targets)

    return model, make_batch, loss_fn
