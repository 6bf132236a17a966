"""Measure the zoo's training memory on a real GPU, one fresh process per row, and append one JSON
line per row to benchmarks/data/gpu_measurements.jsonl: the setup, torch.cuda.max_memory_allocated /
max_memory_reserved, the process's memory in nvidia-smi, and the GPU, driver, CUDA and torch versions.

    python benchmarks/gpu_measure.py [--quick] [--out FILE]
Without a CUDA device it says so and writes nothing: a GPU number is only ever a measured one.
Sized to finish in under 8 minutes on one GPU (about 5 s a row, mostly process start and CUDA init).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from accuracy_cpu import OPTIMIZERS, ZOO  # noqa: E402 - the same zoo as the CPU accuracy benchmark
from trainmem.errors import TrainmemError  # noqa: E402
from trainmem.measure.single_process import run_child  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

MODELS = ROOT / "tests" / "models.py"
HF = ROOT / "benchmarks" / "hf_models.py"
EXTRA = [  # precisions and optimizer implementations that change what a GPU run holds
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {"precision": "bf16-mixed", "optimizer": "adamw"}, 16),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {"precision": "fp16-mixed", "optimizer": "adamw"}, 16),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {"optimizer": "adamw", "optimizer_impl": "fused"}, 16),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {"optimizer": "adamw", "optimizer_impl": "for-loop"}, 16),
    ("resnet_small", f"{MODELS}:resnet_small", {"precision": "bf16-mixed", "optimizer": "momentum"}, 32),
    # the published calibration points' models (benchmarks/data/gpu_published.jsonl), when transformers is there
    ("bert_base_mlm", f"{HF}:bert_base_mlm", {"optimizer": "adamw"}, 2),
    ("gpt2_clm", f"{HF}:gpt2_clm", {"optimizer": "adamw"}, 2),
    ("vit_base", f"{HF}:vit_base_classification", {"optimizer": "adamw"}, 2),
    ("gpt2_clm", f"{HF}:gpt2_clm", {"optimizer": "adamw", "precision": "bf16-mixed"}, 8),
    # hf: references, LoRA through peft and the Trainer's defaults (all real code on a GPU; QLoRA and the
    # 8-bit optimizers are left out: here they would run trainmem's stand-ins, not bitsandbytes)
    ("hf:gpt2", "hf:gpt2", {"seq_len": 512, "hf_trainer": True, "precision": "bf16-mixed"}, 8),
    ("hf:gpt2+lora", "hf:gpt2", {"seq_len": 512, "lora": "r=16,alpha=32,targets=c_attn", "precision": "bf16-mixed",
                                 "optimizer": "adamw"}, 8),
    ("hf:Qwen2.5-0.5B+lora", "hf:Qwen/Qwen2.5-0.5B", {"seq_len": 1024, "lora": "r=16,alpha=32,targets=q_proj,v_proj",
                                                       "precision": "bf16-mixed", "optimizer": "adamw",
                                                       "checkpointing": True}, 4),
]


def rows(quick: bool) -> list[tuple[str, str, dict]]:
    out = []
    for name, ref, extra, batches in ZOO:
        for batch in batches[:1] if quick else batches:
            out += [(name, ref, {"batch_size": batch, "optimizer": opt, **extra}) for opt in OPTIMIZERS]
    out += [(name, ref, {"batch_size": batch, **values}) for name, ref, values, batch in EXTRA]
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="first batch size of each model only")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/data/gpu_measurements.jsonl"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}); nothing measured, nothing written")
        return
    started = time.perf_counter()
    with open(args.out, "a") as out:
        for name, ref, values in rows(args.quick):
            setup = TrainingSetup.from_mapping(values)
            try:
                measured = run_child(ref, setup, "cuda")
            except TrainmemError as error:
                measured = {"error": str(error)}
            row = {"source": "measured: python benchmarks/gpu_measure.py", "date": datetime.date.today().isoformat(),
                   "model": name, "model_ref": ref.replace(str(ROOT) + "/", ""), "setup": setup.to_dict(), **measured}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{name} {values}: allocated {measured.get('max_memory_allocated')} reserved "
                  f"{measured.get('max_memory_reserved')} process {measured.get('process_bytes')}", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
