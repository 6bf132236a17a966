"""Golden report snapshot for the seed MLP. Rewrite on purpose only:
    TRAINMEM_UPDATE_GOLDENS=1 python -m pytest tests/test_golden.py"""

import os
from pathlib import Path

import trainmem

GOLDEN = Path(__file__).parent / "golden" / "seed_mlp.txt"


def _report() -> str:
    est = trainmem.estimate("mlp:1000-100-100-100-100-10", batch_size=256, optimizer="adam", input_shape="1000")
    lines = str(est).splitlines()
    # the device capacity and the floor's provenance depend on the machine; the arithmetic does not
    # (process_bytes_high in "where the objects fall" is built on the floor of the torch build installed)
    machine = ("  process (peak RSS)", "  process, high end", "  process_floor", "  runtime_", "  tensor_heap_resident",
               "  - process floor", "  - this process runs", "  - where the objects fall", "  - peak RSS is the run's")
    return "\n".join(line for line in lines if not line.startswith(machine)) + "\n"


def test_seed_mlp_report_matches_golden():
    text = _report()
    if os.environ.get("TRAINMEM_UPDATE_GOLDENS"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
