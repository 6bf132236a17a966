"""What each training-script integration adds to a run: the time from the start of training (trainer.train(),
trainer.fit(), model.fit(), the guarded loop) to the end of its second step, with the check and without it, in
fresh processes (imports excluded: both arms import the same libraries). Medians of --runs processes per arm.

    python benchmarks/integrations_overhead.py [--runs 3]

Writes benchmarks/results/integrations.md. The models are tiny on purpose: what is measured is the estimate's
cost, which a larger model's first step would hide.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "integrations.md"
KINDS = {"guard": "plain PyTorch, `with trainmem.guard(...)` (MLP 1000-100-10, Adam, batch 256)",
         "hf": "transformers Trainer + MemoryCheckCallback (GPT-2, 2 layers × 64, seq 32, batch 8)",
         "lightning": "Lightning Trainer + MemoryCheck (MLP 64-256-10, AdamW, batch 32)",
         "keras": "Keras fit + MemoryCheck (MLP 64-256-10, Adam, batch 128)"}


def run_guard(on: bool) -> float:
    import torch

    import trainmem

    model = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(256, 1000), torch.randint(0, 10, (256,))
    started = time.perf_counter()
    if on:
        with trainmem.guard(model, optimizer, x):
            pass
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return time.perf_counter() - started


def run_hf(on: bool) -> float:
    import torch
    import transformers

    from trainmem.integrations.hf_trainer import MemoryCheckCallback

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, index):
            return {"input_ids": torch.zeros(32, dtype=torch.long), "labels": torch.zeros(32, dtype=torch.long)}

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    args = transformers.TrainingArguments(output_dir="/tmp/trainmem-bench-hf", per_device_train_batch_size=8,
                                          max_steps=2, report_to=[], save_strategy="no", use_cpu=True,
                                          disable_tqdm=True, logging_strategy="no")
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                                   callbacks=[MemoryCheckCallback()] if on else [])
    started = time.perf_counter()
    trainer.train()
    return time.perf_counter() - started


def run_lightning(on: bool) -> float:
    import lightning as L
    import torch

    from trainmem.integrations.lightning import MemoryCheck

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randint(0, 10, (512,)))
    trainer = L.Trainer(max_steps=2, accelerator="cpu", callbacks=[MemoryCheck()] if on else [], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    started = time.perf_counter()
    trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=32))
    return time.perf_counter() - started


def run_keras(on: bool) -> float:
    import keras
    import numpy as np

    from trainmem.integrations.keras import MemoryCheck

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.zeros((1024, 64), "float32"), np.zeros(1024, "int64")
    started = time.perf_counter()
    model.fit(x, y, batch_size=128, epochs=1, steps_per_epoch=2, verbose=0,
              callbacks=[MemoryCheck(batch_size=128)] if on else [])
    return time.perf_counter() - started


def one_process(kind: str, on: bool) -> float:
    done = subprocess.run([sys.executable, __file__, "--child", kind, "--on" if on else "--off"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{kind} {'on' if on else 'off'} failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--on", action="store_true")
    parser.add_argument("--off", action="store_true")
    args = parser.parse_args()
    if args.child:
        seconds = {"guard": run_guard, "hf": run_hf, "lightning": run_lightning, "keras": run_keras}[args.child](args.on)
        print(json.dumps({"seconds": seconds}), flush=True)
        os._exit(0)
    rows = []
    for kind, what in KINDS.items():
        off = [one_process(kind, False) for _ in range(args.runs)]
        on = [one_process(kind, True) for _ in range(args.runs)]
        rows.append((what, statistics.median(off), statistics.median(on), min(off), max(off), min(on), max(on)))
        print(f"{kind}: without {statistics.median(off):.2f} s, with {statistics.median(on):.2f} s", flush=True)
    lines = ["# What the training-script integrations add", "",
             f"Generated {time.strftime('%Y-%m-%d')} by `python benchmarks/integrations_overhead.py --runs {args.runs}` "
             f"on {os.cpu_count()} cores: the time from the start of training to the end of its second step, medians "
             f"(min–max) of {args.runs} fresh processes per arm; imports are outside the timed part in both arms.", "",
             "| run | without the check, s | with it, s | added, s |", "|---|---:|---:|---:|"]
    for what, off, on, off_lo, off_hi, on_lo, on_hi in rows:
        lines.append(f"| {what} | {off:.2f} ({off_lo:.2f}–{off_hi:.2f}) | {on:.2f} ({on_lo:.2f}–{on_hi:.2f}) | "
                     f"{on - off:+.2f} |")
    lines += ["", "The check traces two training steps on fake tensors and replays the CPU allocator (a GPU run: the "
              "CUDA caching allocator) once; it adds the same on a large model's first step as a trainmem estimate "
              "of that model costs (benchmarks/results/speed.md)."]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
