"""Measure the CPU process floor that trainmem adds to its tensor model of RSS, for the bundled calibrations.

The floor and kernel families are measured as `trainmem calibrate` measures them on a user's machine
(trainmem/calibrate.py, one code path); this script also measures the vision libraries' import sets and
writes the entry, keyed by torch build and machine (vendor, instruction sets, threads), into the package's
bundled src/trainmem/targets/data/cpu_runtime.json.

The floor is the median peak RSS of fresh processes that import torch and train a tiny model
(mlp:8-8-2, batch 1, Adam, two steps), less that model's own heap footprint as trainmem replays it.
Kernel families that map more code or JIT buffers on first use (oneDNN convolution, LSTM,
scaled-dot-product attention) are measured the same way with a tiny model that uses them, as an
increment over the floor, and so is each set of libraries a model reference brings into the process
(hf: transformers; --lora: peft and transformers; torchvision:, timm:, and these with --lora: those
installed), measured as one set because libraries share what they import. Writes this torch build's entry in
src/trainmem/targets/data/cpu_runtime.json, keeping the entries of other builds.

    python benchmarks/calibrate_cpu.py [--runs 5]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.calibrate import above_tensors, measure  # noqa: E402
from trainmem.targets import cpu_runtime  # noqa: E402
from trainmem.targets.calibrations import machine_of  # noqa: E402
from trainmem.targets.cpu_info import CpuInfo  # noqa: E402
# the sets of libraries a model reference brings into the training process, each measured with a tiny
# model that needs them as one increment over the floor: libraries share what they import, so the
# increments of single libraries do not add up (cpu_runtime.runtime_floor)
IMPORT_SETS = {("transformers",): ("hf:tests/data/tiny_llama", {}),
               ("peft", "transformers"): ("hf:tests/data/tiny_llama", {"lora": "r=4,targets=q_proj"}),
               ("torchvision",): ("torchvision:squeezenet1_1", {}),
               ("peft", "torchvision", "transformers"): ("torchvision:squeezenet1_1", {"lora": "r=4,targets=squeeze"}),
               ("timm", "torchvision"): ("timm:mobilenetv3_small_050", {}),
               ("peft", "timm", "torchvision", "transformers"): ("timm:mobilenetv3_small_050",
                                                                  {"lora": "r=4,targets=conv_head"}),
               # a LightningModule's file imports lightning (torchmetrics, fsspec …): the training-script callbacks'
               # processes (trainmem/integrations/lightning.py) hold it
               ("lightning",): ("tests/data/lightning_step.py:tiny_step", {})}
# single libraries, for a set not measured: (library, the set it is measured in, the set below it)
SINGLE_LIBRARIES = {"transformers": (("transformers",), ()),
                    "peft": (("peft", "transformers"), ("transformers",)),
                    "torchvision": (("torchvision",), ()),
                    "timm": (("timm", "torchvision"), ("torchvision",)),
                    "lightning": (("lightning",), ())}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cpu-name", required=True,
                        help="how the bundled entry names its CPU, e.g. 'AMD EPYC (AVX512-BF16, no AMX), 2 vCPUs'")
    parser.add_argument("--libraries-only", action="store_true",
                        help="measure the libraries' increments again, keep the floor and kernel families")
    parser.add_argument("--only", metavar="SET", action="append", default=[],
                        help="with --libraries-only: measure only this import set (e.g. lightning), keep the others")
    args = parser.parse_args()
    out = ROOT / "src/trainmem/targets/data/cpu_runtime.json"
    calibrations = json.loads(out.read_text())["calibrations"] if out.exists() else []
    cpu = CpuInfo.this_machine()
    here = machine_of(cpu)

    def same_machine(entry: dict) -> bool:  # one entry per torch build and machine; CPU models of one ISA apart
        return (entry["torch"], entry.get("machine_facts"), entry.get("cpu_model_id", "")) == (
            torch.__version__, here, cpu.model_id)
    old = next((c for c in calibrations if same_machine(c)), {})
    if args.libraries_only:
        floor, families = old["floor_bytes"], old["families"]
    else:
        measured = measure(args.runs, libraries=False, say=print)
        floor, families = measured["floor_bytes"], measured["families"]
    import_sets: dict[tuple[str, ...], int] = {tuple(key.split("+")): value for key, value in
                                               old.get("import_sets", {}).items()} if args.only else {}
    for libraries, (ref, extra) in IMPORT_SETS.items():
        if args.only and cpu_runtime.import_set_key(libraries) not in args.only:
            continue
        if any(importlib.util.find_spec(library) is None for library in libraries):
            print(f"libraries {'+'.join(libraries)}: not installed here, not measured")
            continue
        where = (ref.replace("hf:", f"hf:{ROOT}/") if ref.startswith("hf:") else
                 f"{ROOT}/{ref}" if ref.startswith("tests/") else ref)  # a repository path, wherever this runs from
        above, peaks = above_tensors(where, args.runs, extra)
        import_sets[libraries] = max(0, above - floor)
        print(f"libraries {'+'.join(libraries)}: +{import_sets[libraries]:,} B (peak RSS of runs: {peaks})")
    libraries = {library: max(0, import_sets[within] - import_sets.get(below, 0))
                 for library, (within, below) in SINGLE_LIBRARIES.items()
                 if within in import_sets and (not below or below in import_sets)}
    data = {"floor_bytes": floor, "families": families, "libraries": libraries,
            "import_sets": {cpu_runtime.import_set_key(key): value for key, value in import_sets.items()}, "runs": args.runs,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip() + f", {platform.python_version()}",
            "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "command": "python benchmarks/calibrate_cpu.py",
            "cpu": args.cpu_name, "machine_facts": here, "cpu_model_id": cpu.model_id,
            "measured": datetime.date.today().isoformat()}
    if args.only:  # the entry as it was, with the sets measured now added and said so
        added = {key: f"python benchmarks/calibrate_cpu.py --libraries-only --only {key} --runs {args.runs}, "
                      f"{datetime.date.today().isoformat()}" for key in args.only}
        data = {**old, "libraries": libraries, "import_sets": data["import_sets"],
                "added_sets": {**old.get("added_sets", {}), **added}}
    calibrations = [data if same_machine(c) else c for c in calibrations]
    if data not in calibrations:
        calibrations.append(data)
    out.write_text(json.dumps({"calibrations": calibrations}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
