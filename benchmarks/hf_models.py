"""Hugging Face models built from their published configurations (no download), as `file.py:factory`
references for the GPU calibration points in benchmarks/data/gpu_published.jsonl. transformers is
imported only when a factory is called. Each factory returns the model, how to make a batch, and the
loss the published run trained with (the model's own head and loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _tokens(vocab: int, seq: int):
    def make_batch(batch_size):
        return (torch.randint(0, vocab, (batch_size, seq)),)
    return make_batch


def _lm_loss(vocab: int, shift: bool):
    def loss_fn(output, inputs, *target):
        logits, labels = output.logits, inputs[0]
        if shift:  # causal LM: predict the next token (GPT2LMHeadModel's loss)
            logits, labels = logits[:, :-1, :], labels[:, 1:]
        return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
    return loss_fn


def _class_loss(output, inputs, *target):
    logits = output.logits
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def bert_base_mlm(seq: int = 16):
    """bert-base-uncased (BertConfig's defaults are its configuration) with the masked-LM head."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()
    return {"model": BertForMaskedLM(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _lm_loss(config.vocab_size, shift=False)}


def gpt2_clm(seq: int = 16):
    """openai-community/gpt2 (GPT2Config's defaults) with the LM head, tied to the embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    return {"model": GPT2LMHeadModel(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _lm_loss(config.vocab_size, shift=True)}


def roberta_base_multiple_choice(seq: int = 16, choices: int = 1):
    """FacebookAI/roberta-base's configuration (514 positions, one token type, padding id 1)."""
    from transformers import RobertaConfig, RobertaForMultipleChoice

    config = RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)

    def make_batch(batch_size):
        return (torch.randint(3, config.vocab_size, (batch_size, choices, seq)),)
    return {"model": RobertaForMultipleChoice(config), "make_batch": make_batch, "loss_fn": _class_loss}


def vit_base_classification():
    """google/vit-base-patch16-224: 224×224 images, patch 16, the 1000-class ImageNet head."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(num_labels=1000)

    def make_batch(batch_size):
        return (torch.randn(batch_size, 3, 224, 224),)
    return {"model": ViTForImageClassification(config), "make_batch": make_batch, "loss_fn": _class_loss}


def bert_large_classification_eager(seq: int = 512):
    """bert-large-uncased for sequence classification (2 labels), with the eager attention of the
    transformers release the Hugging Face single-GPU training guide measured (v4.21, 2022)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        num_labels=2, attn_implementation="eager")
    return {"model": BertForSequenceClassification(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _class_loss}
