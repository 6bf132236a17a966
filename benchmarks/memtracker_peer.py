"""The peer: PyTorch's own MemTracker (torch.distributed._tools.mem_tracker) on the speed benchmark's GPT-style 1.3B,
written as its docstring shows, on fake tensors so that it needs no memory, timed by benchmarks/speed.py beside
trainmem's estimate of the same setup (seq 1024, batch 8, AdamW, bf16 autocast, two training steps).

    python benchmarks/memtracker_peer.py            # prints MemTracker's peak and the seconds it took

It imports nothing of trainmem: the model comes from tests/models.py, the loop is the one a user writes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from models import gpt_1b3  # noqa: E402

BATCH, STEPS = 8, 2


def main() -> None:
    started = time.perf_counter()
    with FakeTensorMode():
        model, make_batch = gpt_1b3()
        optimizer = torch.optim.AdamW(model.parameters())
        (tokens,) = make_batch(BATCH)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, tokens)
        with tracker:
            for step in range(STEPS):
                if step:
                    tracker.reset_mod_stats()  # its module statistics cover one iteration (MemTracker's own error)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    print(f"MemTracker peak: {peak / 2**30:.2f} GiB; {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
