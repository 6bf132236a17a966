"""Models that benchmarks/speed.py times and tests/models.py does not hold at the size timed.

`bigru_seq200`: tests/models.py's two-layer bidirectional GRU classifier on 200-token sequences (the zoo's
`bigru` uses 64): a trace that is long in ops (each time step is a handful of ops per direction and layer)
and in outputs that never get a grad_fn, the case that made the trace's cost grow with its length.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from models import _BiGRUClassifier, _tokens  # noqa: E402


def bigru_seq200():
    """tests/models.py:bigru with 200 tokens per sample."""
    return _BiGRUClassifier(), _tokens(8000, 200)
