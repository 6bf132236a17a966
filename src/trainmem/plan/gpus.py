"""`--gpus 8xh100-80gb`: how many GPUs of which catalog device. No torch."""

from __future__ import annotations

import dataclasses
import re

from trainmem.devices import Device, get_device
from trainmem.errors import SetupError, TrainmemError, quote
from trainmem.setup.layout import MAX_WORLD_SIZE

_FORM = re.compile(r"^\s*(\d+)\s*[x×]\s*(\S.*?)\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Gpus:
    count: int
    device: Device
    text: str  # as given, for the report

    def to_dict(self) -> dict:
        return {"count": self.count, "device": self.device.name, "capacity_bytes": self.device.capacity_bytes}


def parse_gpus(text: object, where: str = "--gpus") -> Gpus:
    """COUNTxDEVICE, DEVICE from the device catalog (`trainmem devices`) or custom:…; one line when not."""
    match = _FORM.match(text) if isinstance(text, str) else None
    if match is None:
        raise SetupError(f"expected COUNTxDEVICE such as 8xh100-80gb, got {quote(text)}", where=where)
    count = int(match.group(1))
    if not 1 <= count <= MAX_WORLD_SIZE:
        raise SetupError(f"expected 1 to {MAX_WORLD_SIZE:,} GPUs, got {count:,}", where=where)
    try:
        device = get_device(match.group(2))
    except TrainmemError as error:
        raise SetupError(error.message, where=where) from None
    if device.gpu is None:  # the CPU: a plan lays a model out over GPUs
        raise SetupError(f"expected a GPU from `trainmem devices` after the count, got {quote(match.group(2))}",
                         where=where)
    return Gpus(count, device, text.strip())
