"""Hostile model factories for tests/test_hostile.py: each is what a user's `file.py:factory` might do.

trainmem executes this file only because a case names it as code (`factories.py:NAME`)."""

import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn


def small():
    """A model that works, for cases whose hostility is in the flags."""
    return nn.Sequential(nn.Linear(10, 5), nn.ReLU(), nn.Linear(5, 2))


def returns_none():
    return None


def returns_tensor():
    return torch.zeros(3)


def returns_class():
    return nn.Linear  # the class, not a module


def raises():
    raise RuntimeError("the user's factory failed on purpose")


def imports_missing():
    import trainmem_hostile_no_such_module  # noqa: F401

    return small()


def takes_arguments(width):
    return nn.Linear(width, 2)


def prints():
    print("hello from the factory's print")
    return small()


def prints_from_c():
    """Writes to file descriptor 1 directly, as C code (a library's banner) would."""
    os.write(1, b"hello from the factory's file descriptor 1\n")
    return small()


def exits_0():
    sys.exit(0)


def exits_3():
    sys.exit(3)


def hard_exit():
    os._exit(0)  # no Python cleanup at all: nothing can catch it


def raises_keyboard_interrupt():
    raise KeyboardInterrupt


def loops_forever():
    """Spins until the process is interrupted; writes HOSTILE_MARKER first so the test knows it is spinning."""
    marker = os.environ.get("HOSTILE_MARKER")
    if marker:
        Path(marker).write_text("spinning")
    while True:
        time.sleep(0.01)


class _ForwardFails(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 2)

    def forward(self, inputs):
        raise ValueError("the user's forward failed on purpose")


def forward_raises():
    return _ForwardFails()


def wrong_batch_maker():
    """make_batch returns a string instead of tensors."""
    return small(), lambda batch_size: "not a tensor"


def loss_not_scalar():
    return small(), lambda batch_size: torch.randn(batch_size, 10), lambda output, inputs: output


def places_layer_on_cpu():
    """Names a device explicitly: inside `with torch.device('meta')` an explicit device still wins, so
    unless the build intercepts it this is a 1 GB weight allocated (and initialized) for real."""
    return nn.Sequential(nn.Linear(16000, 16000, device="cpu"), nn.Linear(16000, 2))


def moves_to_cuda():
    """What many training scripts do in their model factory; this machine may have no GPU at all."""
    return small().to("cuda")


class _EndlessForward(nn.Module):
    """A forward of ten million small ops: on fake tensors, a trace that takes minutes."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 2)

    def forward(self, inputs):
        marker = os.environ.get("HOSTILE_MARKER")
        if marker:
            Path(marker).write_text("tracing")
        for _ in range(10_000_000):
            inputs = inputs + 1
        return self.linear(inputs)


def endless_forward():
    return _EndlessForward()


def no_parameters():
    return nn.Sequential(nn.ReLU(), nn.Tanh())


def all_frozen():
    model = small()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


# --- for the supervised worker (the `trainmem` command runs the model's code in a process of its own) ---------


def prints_at_exit():
    import atexit

    atexit.register(lambda: print("goodbye from atexit"))
    return small()


def raises_generator_exit():
    raise GeneratorExit("stop")


class NotAnException(BaseException):
    pass


def raises_base_exception():
    raise NotAnException("a BaseException of the user's")


def never_ending_thread():
    import threading
    import time

    threading.Thread(target=lambda: time.sleep(3600)).start()  # not a daemon: it would hold the exit
    return small()


def forks():
    os.fork()  # both copies go on building and tracing the model
    return small()
