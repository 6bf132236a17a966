"""transformers' Trainer: the callback estimates the run as the Trainer is about to execute it and stops it before
the first step when it does not fit. Run from the repository root: python examples/train_hf.py"""

import logging
import tempfile

import torch
import transformers

from trainmem.integrations.hf_trainer import MemoryCheckCallback

logging.basicConfig(level=logging.INFO, format="%(message)s")
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                                 bos_token_id=0, eos_token_id=0)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        ids = torch.randint(0, 1000, (32,))
        return {"input_ids": ids, "labels": ids}


with tempfile.TemporaryDirectory(prefix="trainmem-example-") as out:  # the Trainer's output_dir, removed after
    args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=8, max_steps=2, report_to=[],
                                          save_strategy="no", use_cpu=True)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                                   callbacks=[MemoryCheckCallback()])  # logs "trainmem: training at batch 8 fits …"
    trainer.train()
