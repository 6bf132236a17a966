"""Same command, same bytes: the estimate does not depend on the process it runs in (hash seed, addresses, what
ran before it in the process). Sources of difference found and removed: FakeTensorMode's process-wide dispatch
cache serving outputs rebuilt apart (now checked: trace/fake_cache.py), autocast's cast cache freed in address
order (trace/autocast_cache.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainmem

MODELS = str(Path(__file__).with_name("models.py"))


def _peak(seed: int, *flags: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainmem", "estimate", *flags, "--format", "json", "--steps", "4"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONHASHSEED": str(seed)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["peak"]


@pytest.mark.heavy
@pytest.mark.parametrize("flags", [
    (f"{MODELS}:tiny_gpt", "--batch-size", "8", "--target-shape", "128", "--precision", "bf16-mixed"),
    (f"{MODELS}:lstm", "--batch-size", "8", "--target-shape", "scalar", "--precision", "bf16-mixed"),
])
def test_the_same_command_gives_the_same_bytes_in_every_process(flags):
    assert _peak(1, *flags) == _peak(2, *flags)


def test_an_estimate_does_not_depend_on_what_ran_before_it_in_the_process():
    first = trainmem.estimate(f"{MODELS}:lstm", batch_size=2, target_shape="scalar", grad_accum=2, run_steps=2)
    trainmem.estimate(f"{MODELS}:lstm", batch_size=2, target_shape="scalar", run_steps=2)
    again = trainmem.estimate(f"{MODELS}:lstm", batch_size=2, target_shape="scalar", grad_accum=2, run_steps=2)
    assert (first.tensor_bytes, first.process_bytes) == (again.tensor_bytes, again.process_bytes)
