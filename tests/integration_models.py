"""Factories (model, make_batch[, loss_fn]) written by hand, for tests/test_integrations.py to hold each training
script integration against `trainmem.estimate` of a reference: the same model and batch, described the way a
user writes a factory file, not the way integrations/live.py reads the live objects."""

import torch
import torch.nn as nn

GPT2 = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64, bos_token_id=0, eos_token_id=0)
SEQ = 32


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def mlp_factory():
    return mlp(), lambda n: (torch.randn(n, 64),)


def tiny_gpt2_model():
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))


def tiny_gpt2():
    """The model as transformers' Trainer runs it (it sets config.use_cache from TrainingArguments.use_cache, False
    by default) and the Trainer's batch for a causal LM: input_ids and labels; the model computes its own loss."""
    model = tiny_gpt2_model()
    model.config.use_cache = False

    def make_batch(n):
        ids = torch.zeros(n, SEQ, dtype=torch.long)
        return {"input_ids": ids, "labels": torch.zeros(n, SEQ, dtype=torch.long)}

    return model, make_batch, lambda output, inputs: output.loss


def classifier_step():
    """tests/test_integrations.py's Classifier as a factory: its training_step (cross-entropy of the MLP's logits
    against the batch's labels) is the forward, and its output the loss."""
    class TrainingStep(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x, y):
            return nn.functional.cross_entropy(self.net(x), y)

    return TrainingStep(), lambda n: (torch.randn(n, 64), torch.zeros(n, dtype=torch.long)), lambda loss, inputs: loss
