"""Which oneDNN the running PyTorch bundles, read from its build configuration.

The oneDNN sources pinned by a PyTorch release decide sizes the CPU rules compute (the LSTM
workspace changed its layout between oneDNN 3.5 and 3.12, see rnn_workspace.py). PyTorch has no
accessor for the bundled version, but ``torch.__config__.show()`` prints it on one line, e.g.
``  - Intel(R) MKL-DNN v3.5.3 (Git Hash 66f0cb9e...)`` (torch 2.6) or ``... v3.12.0 ...`` (torch 2.13).
"""

from __future__ import annotations

import functools
import re

OneDnnVersion = tuple[int, int, int]

# the line at::show_config (aten/src/ATen/Version.cpp) prints for a build with oneDNN
_CONFIG_LINE = re.compile(r"MKL-DNN v(\d+)\.(\d+)(?:\.(\d+))?")


def parse_onednn_version(config: str) -> OneDnnVersion | None:
    """The oneDNN version in a ``torch.__config__.show()`` text, or None for a build without oneDNN."""
    match = _CONFIG_LINE.search(config)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


@functools.cache
def bundled_onednn_version() -> OneDnnVersion | None:
    """The oneDNN of the torch in this process (read once: it cannot change while torch is loaded)."""
    import torch

    return parse_onednn_version(torch.__config__.show())


def version_text(version: OneDnnVersion | None) -> str:
    return "an unknown oneDNN" if version is None else "oneDNN " + ".".join(map(str, version))
