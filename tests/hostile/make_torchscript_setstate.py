"""Writes torchscript_setstate.pt beside this file: a TorchScript module whose __setstate__ prints and
allocates a 1 GB tensor when torch.jit.load runs it (tests/test_hostile.py). Run with the dev venv."""
from pathlib import Path

import torch


class LoadsHeavily(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4, 2))
        self.hoard = torch.zeros(1)

    def forward(self, x):
        return x @ self.weight

    @torch.jit.export
    def __getstate__(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        return (self.weight, self.hoard, self.training)

    @torch.jit.export
    def __setstate__(self, state: tuple[torch.Tensor, torch.Tensor, bool]) -> None:
        print("hello from TorchScript __setstate__")
        self.weight = state[0]
        self.hoard = torch.ones(16000, 16000)
        self.training = state[2]


scripted = torch.jit.script(LoadsHeavily())
torch.jit.save(scripted, str(Path(__file__).with_name("torchscript_setstate.pt")))
