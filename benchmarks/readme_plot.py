"""The README's plot: `trainmem estimate --plot` on GPT-2 (124M, built from its bundled configuration, no
download) fine-tuned with AdamW in bf16 mixed precision, batch 24 of 512 tokens, on an A100 40 GB.

    python benchmarks/readme_plot.py            # writes docs/images/timeline.png, prints the command it ran

The command runs as a user would run it (the CLI in a process of its own); its report goes to this
script's stdout, then the command, the time it took and the image's size. The PNG has no date in it, so
the same estimate draws the same bytes and a re-run shows in `git diff` only when the estimate changed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = Path("docs/images/timeline.png")
COMMAND = ["trainmem", "estimate", "hf:gpt2", "--batch-size", "24", "--seq-len", "512", "--optimizer", "adamw",
           "--precision", "bf16-mixed", "--device", "a100-40gb", "--plot", str(IMAGE)]
MAX_IMAGE_BYTES = 300 * 1024  # the README's image stays small in the repository


def main() -> int:
    (ROOT / IMAGE).parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainmem", *COMMAND[1:]], cwd=ROOT, check=False)
    seconds = time.perf_counter() - started
    print(f"\n$ {shlex.join(COMMAND)}")
    if done.returncode != 0:
        print(f"failed: exit {done.returncode}", file=sys.stderr)
        return done.returncode
    size = (ROOT / IMAGE).stat().st_size
    print(f"wrote {IMAGE} ({size / 1024:.0f} KiB) in {seconds:.1f} s (the interpreter and torch's import included)")
    if size > MAX_IMAGE_BYTES:
        print(f"the image is {size:,} B, above the {MAX_IMAGE_BYTES:,} B the README's image may take", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
