"""Hugging Face models built from their configurations (no download), for the GPU calibration points.
Factories in the `file.py:factory` form; transformers is imported only when one is called."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bert_base_mlm(seq: int = 16):
    """bert-base-uncased (BertConfig's defaults are its configuration) with the masked-LM head; the
    loss is the model's own cross-entropy over every position, as the fill-mask benchmark trains."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()

    def make_batch(batch_size):
        return (torch.randint(0, config.vocab_size, (batch_size, seq)),)

    def loss_fn(output, inputs, *target):
        return F.cross_entropy(output.logits.view(-1, config.vocab_size), inputs[0].view(-1))

    return {"model": BertForMaskedLM(config), "make_batch": make_batch, "loss_fn": loss_fn}
