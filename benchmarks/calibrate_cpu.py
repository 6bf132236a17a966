"""Measure the CPU process floor that trainmem adds to its tensor model of RSS.

The floor is the median peak RSS of fresh processes that import torch and train a tiny model
(mlp:8-8-2, batch 1, Adam, two steps), less that model's own heap footprint as trainmem replays it.
Kernel families that map more code or JIT buffers on first use (oneDNN convolution, LSTM,
scaled-dot-product attention) are measured the same way with a tiny model that uses them, as an
increment over the floor, and so are the libraries a model reference imports (transformers, peft,
torchvision, timm: those installed). Writes this torch build's entry in
src/trainmem/targets/data/cpu_runtime.json, keeping the entries of other builds.

    python benchmarks/calibrate_cpu.py [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.alloc.cpu import replay_resident  # noqa: E402
from trainmem.frontends import resolve  # noqa: E402
from trainmem.measure.cpu import run_child  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402
from trainmem.targets import cpu as cpu_target  # noqa: E402
from trainmem.trace.run import trace_training  # noqa: E402

FAMILIES = {"convolution": "tests/models.py:tiny_conv", "lstm": "tests/models.py:tiny_lstm",
            "attention": "tests/models.py:tiny_attention"}
# libraries a model reference imports into the training process (the hf: frontend imports transformers;
# --lora imports peft), measured as increments over the floor with a tiny model that needs them
# (library: reference, setup, the libraries that run imports besides it)
LIBRARIES = {"transformers": ("hf:tests/data/tiny_llama", {}, ()),
             "peft": ("hf:tests/data/tiny_llama", {"lora": "r=4,targets=q_proj"}, ("transformers",)),
             "torchvision": ("torchvision:squeezenet1_1", {}, ()),
             "timm": ("timm:mobilenetv3_small_050", {}, ("torchvision",))}


def rss_above_tensors(ref: str, runs: int, extra: dict | None = None) -> tuple[int, list[int]]:
    import torch

    setup = TrainingSetup.from_mapping({"batch_size": 1, "optimizer": "adam", **(extra or {}),
                                        **({"input_shape": "8"} if ref.startswith("mlp:") else {})})
    peaks = [run_child(ref, setup, "rss")["peak_rss_bytes"] for _ in range(runs)]
    traced = trace_training(resolve(ref, setup), setup, cpu_target.kernel_ops())
    stream, _ = cpu_target.device_stream(traced.trace, torch.backends.cpu.get_cpu_capability())
    return int(statistics.median(peaks)) - replay_resident(stream), peaks


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--libraries-only", action="store_true",
                        help="measure the library increments again, keep the floor and kernel families")
    args = parser.parse_args()
    out = ROOT / "src/trainmem/targets/data/cpu_runtime.json"
    calibrations = json.loads(out.read_text())["calibrations"] if out.exists() else []
    old = next((c for c in calibrations if c["torch"] == torch.__version__), {})
    if args.libraries_only:
        floor, families = old["floor_bytes"], old["families"]
    else:
        floor, peaks = rss_above_tensors("mlp:8-8-2", args.runs)
        print(f"floor: {floor:,} B (peak RSS of runs: {peaks})")
        families = {}
        for family, ref in FAMILIES.items():
            above, peaks = rss_above_tensors(str(ROOT / ref.split(':')[0]) + ":" + ref.split(":")[1], args.runs)
            families[family] = max(0, above - floor)
            print(f"{family}: +{families[family]:,} B (peak RSS of runs: {peaks})")
    libraries: dict[str, int] = {}
    for library, (ref, extra, also) in LIBRARIES.items():  # each over the floor and what its run also imports
        if importlib.util.find_spec(library) is None or any(a not in libraries for a in also):
            print(f"library {library}: not installed here, not measured")
            continue
        above, peaks = rss_above_tensors(ref.replace("hf:", f"hf:{ROOT}/"), args.runs, extra)
        libraries[library] = max(0, above - floor - sum(libraries[a] for a in also))
        print(f"library {library}: +{libraries[library]:,} B (peak RSS of runs: {peaks})")
    data = {"floor_bytes": floor, "families": families, "libraries": libraries, "runs": args.runs,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip() + f", {platform.python_version()}",
            "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "command": "python benchmarks/calibrate_cpu.py"}
    calibrations = [c for c in calibrations if c["torch"] != data["torch"]] + [data]
    out.write_text(json.dumps({"calibrations": calibrations}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
