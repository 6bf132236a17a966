"""The CPU RNG state torch.utils.checkpoint keeps for each checkpointed call.

torch/utils/checkpoint.py, with preserve_rng_state=True (its default), saves `torch.get_rng_state()` when a
checkpointed block runs forward and restores it with `torch.set_rng_state` before the recomputation in
backward, so dropout draws the same masks. The state is a uint8 CPU tensor (CPUGeneratorImpl::get_state:
5,056 bytes on torch 2.13's CPU generator), made through c10's CPU allocator and kept by the checkpoint's frame
until backward has recomputed the block. A fake trace does not see it: the generator makes it outside the
dispatcher. `checkpoint_rng_states` makes it an allocation the recorder sees, of the real state's size, kept
as long as the checkpoint keeps it, and marked as host memory (a GPU run keeps it in RAM too). Its restore
is skipped: a fake trace draws no numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_REAL_GET = torch.get_rng_state
_REAL_SET = torch.set_rng_state


def state_bytes() -> int:
    """Bytes of this torch build's CPU RNG state, read from the real generator (it allocates nothing lasting)."""
    return int(_REAL_GET().numel())


@contextlib.contextmanager
def checkpoint_rng_states(recorder) -> Iterator[None]:
    """Within the trace, torch.get_rng_state returns an allocation of the state's size that the recorder
    records (and knows as host memory), and torch.set_rng_state accepts it without doing anything."""
    nbytes = state_bytes()
    module = torch.utils.checkpoint

    def fake_get_rng_state() -> torch.Tensor:
        state = torch.empty(nbytes, dtype=torch.uint8)
        recorder.trace.host_storages |= set(recorder.storage_ids_of([state]))
        return state

    def fake_set_rng_state(new_state: torch.Tensor) -> None:
        return None

    patched = [(torch, "get_rng_state", fake_get_rng_state), (torch, "set_rng_state", fake_set_rng_state)]
    # torch/utils/checkpoint.py calls torch.get_rng_state through the torch module; older releases imported it
    patched += [(module, name, replacement) for _, name, replacement in patched if hasattr(module, name)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    try:
        for owner, name, replacement in patched:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
