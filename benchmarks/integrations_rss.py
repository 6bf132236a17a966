"""The training-script checks' CPU figure against the run it checks: the same tiny training script run twice in
fresh processes, once with the check (its estimate: process_bytes and process_bytes_high) and once without it for
32 optimizer steps (the estimate's default run length), whose peak resident set (VmHWM) is the truth. The
script is written here as a user writes it; nothing of trainmem runs in the measured process.

    python benchmarks/integrations_rss.py [--runs 3]

Prints one table (median of --runs measured processes) and writes benchmarks/results/integrations_rss.md.
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
RESULTS = ROOT / "benchmarks" / "results" / "integrations_rss.md"
STEPS = 32
CASES = {"guard": "plain PyTorch loop (MLP 1000-100-10, Adam, batch 256)",
         "hf": "transformers Trainer (GPT-2 2 × 64, seq 32, batch 8, AdamW as the Trainer makes it)",
         "lightning": "Lightning Trainer (MLP 64-256-10, AdamW, batch 32)"}


def vmhwm() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))


def guard_run(check: bool) -> dict:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(1000, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    optimizer = torch.optim.Adam(model.parameters())
    make = lambda: (torch.randn(256, 1000), torch.randint(0, 10, (256,)))  # noqa: E731 - a loader's batch
    if check:
        from trainmem.integrations.guard import check as check_fit

        return _figures(check_fit(model, optimizer, make()[0]))
    for _ in range(STEPS):
        inputs, targets = make()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return {"peak_rss_bytes": vmhwm()}


def hf_run(check: bool) -> dict:
    import torch
    import transformers

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8 * STEPS

        def __getitem__(self, index):
            return {"input_ids": torch.zeros(32, dtype=torch.long), "labels": torch.zeros(32, dtype=torch.long)}

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    callbacks = []
    if check:
        from trainmem.integrations.hf_trainer import MemoryCheckCallback

        callbacks = [MemoryCheckCallback()]
    args = transformers.TrainingArguments(output_dir="/tmp/trainmem-rss-hf", per_device_train_batch_size=8,
                                          max_steps=1 if check else STEPS, report_to=[], save_strategy="no",
                                          use_cpu=True, disable_tqdm=True, logging_strategy="no")
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                                   callbacks=callbacks)
    trainer.train()
    return _figures(callbacks[0].check) if check else {"peak_rss_bytes": vmhwm()}


def lightning_run(check: bool) -> dict:
    import lightning as L
    import torch

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    callbacks = []
    if check:
        from trainmem.integrations.lightning import MemoryCheck

        callbacks = [MemoryCheck()]
    data = torch.utils.data.TensorDataset(torch.randn(32 * STEPS, 64), torch.randint(0, 10, (32 * STEPS,)))
    trainer = L.Trainer(max_steps=1 if check else STEPS, accelerator="cpu", callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=32))
    return _figures(callbacks[0].check) if check else {"peak_rss_bytes": vmhwm()}


def _figures(verdict) -> dict:
    return {"process_bytes": verdict.estimate.process_bytes, "process_bytes_high": verdict.estimate.process_bytes_high}


RUNS = {"guard": guard_run, "hf": hf_run, "lightning": lightning_run}


def child(kind: str, check: bool) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind] + (["--check"] if check else []),
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{kind} failed: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(RUNS[args.child](args.check)), flush=True)
        os._exit(0)
    rows = []
    for kind, what in CASES.items():
        estimate = child(kind, True)
        peaks = [child(kind, False)["peak_rss_bytes"] for _ in range(args.runs)]
        real = statistics.median(peaks)
        rows.append((what, estimate["process_bytes"], estimate["process_bytes_high"], real, min(peaks), max(peaks)))
        print(kind, estimate, peaks, flush=True)
    mib = 2 ** 20
    lines = ["# The training-script checks against the runs they check (CPU peak RSS)", "",
             f"Generated {time.strftime('%Y-%m-%d')} by `python benchmarks/integrations_rss.py --runs {args.runs}` on "
             f"{os.cpu_count()} cores: the check's estimate in one process, the same script trained for {STEPS} "
             f"steps without it in {args.runs} fresh processes (VmHWM, median, min–max).", "",
             "| script | estimate MiB | high end MiB | measured MiB | error | high end ≥ every run |",
             "|---|---:|---:|---:|---:|---|"]
    for what, point, high, real, low_run, high_run in rows:
        lines.append(f"| {what} | {point / mib:.1f} | {high / mib:.1f} | {real / mib:.1f} ({low_run / mib:.1f}–"
                     f"{high_run / mib:.1f}) | {(point - real) / real:+.1%} | {'yes' if high >= high_run else 'no'} |")
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
