"""LitGPT's own models, as `litgpt finetune_lora` trains them, as `file.py:factory` references for the LitGPT rows of
benchmarks/data/gpu_published.jsonl (the 2024 config-hub table and the 2023 resource table). No download: the model
is LitGPT's `lora.GPT` built from LitGPT's own `Config.from_name` with the table's LoRA settings (2024: r=32, alpha=16,
dropout 0.05 on the query and value projections, Phi-3 r=8 on every linear layer and the head; 2023: r=8 on the
query and value projections); the forward and loss are the ones finetune/lora.py's training loop runs (2023 and 2024
alike):

    logits = model(input_ids, lm_head_chunk_size=128)       # the output layer applied per 128 positions
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])  # one cross-entropy per chunk

Estimate with `--trainer fabric` (fabric.setup's forward: under bf16-true every floating output is cast to fp32, so
the logits chunks reach the loss in fp32), `--lora own` (the adapters are LitGPT's, peft adds none) and, for the
QLoRA rows, `--qlora --qlora-layers all` (Fabric's BitsandbytesPrecision replaces every nn.Linear: the `linear`
inside LitGPT's LoRA layers and the output layer too). Needs litgpt (`make .venv/.litgpt-ready`: litgpt 0.4.13
without its dependencies, the last 0.4 release, whose pyproject pinned bitsandbytes 0.42.0 as the 2024 runs had it)
and lightning (its utils import it). lit-gpt's model of October 2023 has the same modules and forward.
"""

from __future__ import annotations

import torch

SEQ = 512  # the table's max_seq_length: samples are truncated there, a micro-batch padded to its longest
HEAD_CHUNK = 128  # finetune/lora.py fit: model(input_ids, lm_head_chunk_size=128)
LORA = dict(lora_r=32, lora_alpha=16, lora_dropout=0.05, lora_query=True, lora_key=False, lora_value=True,
            lora_projection=False, lora_mlp=False, lora_head=False)
# config_hub/finetune/phi-3/{lora,qlora}.yaml: r=8 on every linear layer and the output head
LORA_EVERY_LAYER = dict(lora_r=8, lora_alpha=16, lora_dropout=0.05, lora_query=True, lora_key=True, lora_value=True,
                        lora_projection=True, lora_mlp=True, lora_head=True)


# lit-gpt's finetune/lora.py of October 2023 (the 2023 resource table): LoRA r=8 on the query and value projections,
# the first iteration on the longest Alpaca sample (1,304 tokens)
LORA_2023 = {**LORA, "lora_r": 8}
SEQ_2023 = 1304


def _model(name: str, lora: dict = LORA, seq: int = SEQ):
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy

    class FinetunedGPT(GPT):
        """LitGPT's lora.GPT called as finetune/lora.py's fit calls it (the labels ride along in the batch)."""

        def forward(self, input_ids, labels=None):  # noqa: ARG002 - the loss takes the labels from the batch
            return super().forward(input_ids, lm_head_chunk_size=HEAD_CHUNK)

    config = Config.from_name(name, **lora)
    model = FinetunedGPT(config)
    mark_only_lora_as_trainable(model)
    model.max_seq_length = seq  # fit: min(longest sample, max_seq_length); the rope cache is cut to it

    def make_batch(batch_size):
        ids = torch.randint(0, config.vocab_size, (batch_size, seq))
        return ids, ids.clone()  # input_ids and labels, as the SFT data module gives them

    def loss_fn(logits, inputs, *target):
        targets = inputs[1]
        logits[-1] = logits[-1][..., :-1, :]  # shift: output n predicts token n+1
        return chunked_cross_entropy(logits, targets[..., 1:])

    return {"model": model, "make_batch": make_batch, "loss_fn": loss_fn}


def llama2_7b():
    return _model("Llama-2-7b-hf")


def mistral_7b():
    return _model("Mistral-7B-v0.1")


def llama31_8b():
    return _model("Llama-3.1-8B")


def llama32_1b():
    return _model("Llama-3.2-1B")


def llama32_3b():
    return _model("Llama-3.2-3B")


def phi3_mini():
    return _model("Phi-3-mini-4k-instruct", LORA_EVERY_LAYER)


def llama2_7b_2023():
    return _model("Llama-2-7b-hf", LORA_2023, SEQ_2023)


def llama2_13b_2023():
    return _model("Llama-2-13b-hf", LORA_2023, SEQ_2023)
