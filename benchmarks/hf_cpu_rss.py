"""Peak RSS of Hugging Face fine-tuning on the CPU, written as a user writes it, against trainmem's estimate.

Each row trains a transformers model built from its bundled config (no download) for 32 steps (the run the
estimate's heap replay stands for) in a fresh process that imports torch, transformers and peft only: the
tutorial loop (zero_grad, forward with `labels` so the model computes its own loss, backward, step; `outputs`
and `loss` stay bound until the next iteration rebinds them, as trainmem's default `--loop inline` assumes),
Adam over the parameters that require grad. Measured: /proc VmHWM after the loop, median of --runs fresh processes. Estimated:
`trainmem.estimate` of the same setup (`hf:` reference, --seq-len, --lora). Writes
benchmarks/results/hf_cpu_rss.md.

    .venv/bin/python benchmarks/hf_cpu_rss.py [--runs 3]   # measure this CPU's rows (replacing its earlier set)
    .venv/bin/python benchmarks/hf_cpu_rss.py --re-estimate  # every CPU's recorded rows, estimated again
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "hf_cpu_rss.md"
DATA = ROOT / "benchmarks" / "data" / "hf_cpu_rss.jsonl"
STEPS = 32
NOTE = ("Why the rows moved on 2026-12-08: the runtime's small objects (alloc/small_objects.py) are made by the code "
        "that runs between the ops. A malloc log of two steps of the gpt2 LoRA batch-2 row (LD_PRELOAD shim, "
        "benchmarks/glibc/malloc_log.c), aligned with the estimate's stream: its real objects replayed on that stream "
        "hold 1,315 MiB of heap, the rows calibrated on tests/models.py's plain-PyTorch zoo 1,122 MiB; transformers' "
        "forward leaves about twice the live objects per op (13.7 per `add` output against 6.1-7.1). transformers "
        "models now take rows calibrated on tests/data/tiny_llama (full and LoRA) and DistilBERT "
        "(benchmarks/calibrate_small_objects.py TRANSFORMERS): 1,189 MiB on that log. Every model here is held out from "
        "that calibration. With the plain rows the Zen 4's gpt2 rows were -5.8% (full), -9.5% and -8.4% (LoRA), and "
        "the LoRA batch-2 high end (1,639 MiB) was below two of its runs.")
QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06}  # its config.json
# (label, hub id, transformers model type, task, config overrides, batch, sequence length, LoRA rank or None).
# None of these models is one the small-object rows were calibrated on (benchmarks/calibrate_small_objects.py
# TRANSFORMERS: tests/data/tiny_llama and DistilBERT)
ROWS = [("gpt2 full fine-tune", "openai-community/gpt2", "gpt2", "causal-lm", {}, 2, 128, None),
        ("gpt2 LoRA r=8 (peft's default targets)", "openai-community/gpt2", "gpt2", "causal-lm", {}, 2, 128, 8),
        ("gpt2 LoRA r=8, batch 8", "openai-community/gpt2", "gpt2", "causal-lm", {}, 8, 128, 8),
        ("t5-small full fine-tune", "google-t5/t5-small", "t5", "seq2seq",
         {"decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}, 4, 128, None),
        ("bert-base sequence classification, full", "google-bert/bert-base-uncased", "bert", "seq-cls", {}, 8, 128,
         None),
        ("Qwen2.5-0.5B LoRA r=8", "Qwen/Qwen2.5-0.5B", "qwen2", "causal-lm", QWEN_05B, 2, 128, 8),
        ("ViT-base image classification, full (224 px)", "google/vit-base-patch16-224", "vit", "image-cls",
         {"num_labels": 1000}, 8, 197, None)]
AUTO_CLASS = {"causal-lm": "AutoModelForCausalLM", "seq2seq": "AutoModelForSeq2SeqLM",
              "seq-cls": "AutoModelForSequenceClassification", "image-cls": "AutoModelForImageClassification"}


def _child(model_type: str, task: str, overrides: dict, batch: int, seq: int, rank: int) -> None:
    """The user's loop: nothing of trainmem is imported here."""
    import torch
    import transformers

    torch.set_num_threads(2)
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    model = getattr(transformers, AUTO_CLASS[task]).from_config(config)
    if rank:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0,
                                                           task_type="CAUSAL_LM"))
    model.train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for _ in range(STEPS):  # the tutorial loop trainmem's default (--loop inline) stands for: names stay bound
        optimizer.zero_grad()
        if task == "image-cls":  # a batch of 224 × 224 RGB images (ViT's 196 patches and its class token)
            inputs = {"pixel_values": torch.randn(batch, 3, config.image_size, config.image_size),
                      "labels": torch.zeros(batch, dtype=torch.long)}
        else:
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            inputs = {"input_ids": ids, "labels": {"causal-lm": ids, "seq-cls": torch.zeros(batch, dtype=torch.long),
                                                  "seq2seq": torch.randint(0, config.vocab_size, (batch, seq))}[task]}
        outputs = model(**inputs)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
    with open("/proc/self/status") as handle:
        hwm = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM"))
    print(json.dumps({"hwm": hwm, "torch": torch.__version__}))


def _measure(model_type: str, task: str, overrides: dict, batch: int, seq: int, rank: int | None) -> dict:
    out = subprocess.run([sys.executable, "-P", __file__, "--child", json.dumps([model_type, task, overrides, batch, seq,
                                                                                rank or 0])],
                         capture_output=True, text=True, timeout=1800, check=True).stdout
    return json.loads(next(line for line in out.splitlines()[::-1] if line.startswith("{")))


def _this_cpu() -> tuple[str, str]:
    """(tag, facts in accuracy_cpu.py --as-cpu's form) of this machine: they re-estimate its rows on another one."""
    from trainmem.targets.cpu_info import CpuInfo

    cpu = CpuInfo.this_machine()
    facts = [cpu.vendor, cpu.capability, str(cpu.threads)] + [name for name, on in (
        ("bf16", cpu.avx512_bf16), ("vnni", cpu.avx512_vnni), ("amx", cpu.amx)) if on]
    facts += [f"model={cpu.model_id}"] if cpu.model_id else []
    return cpu.vendor + "_" + cpu.model_id.replace("/", "_"), ",".join(facts)


def _estimate(record: dict):
    """trainmem's estimate of a recorded row, as for the CPU it was measured on."""
    import trainmem
    from accuracy_cpu import cpu_from_facts
    from trainmem.targets.cpu_info import CpuInfo

    other = cpu_from_facts(record["as_cpu"])
    saved = CpuInfo.__dict__["this_machine"]
    CpuInfo.this_machine = classmethod(lambda cls: other)
    try:
        return trainmem.estimate(f"hf:{record['hub']}", batch_size=record["batch"], seq_len=record["seq"],
                                 task=record.get("task", "causal-lm"), optimizer="adam", device="cpu",
                                 **({"lora": f"r={record['rank']}"} if record["rank"] else {}))
    finally:
        CpuInfo.this_machine = saved


def _line(record: dict) -> tuple[str, bool, float]:
    est, runs = _estimate(record), record["runs_bytes"]
    measured, mib = statistics.median(runs), 2**20
    error = est.process_bytes / measured - 1
    covered = est.process_bytes_high >= max(runs)
    return (f"| {record['label']} | {record['batch']} | {record['seq']} | {est.tensor_bytes / mib:,.1f} | "
            f"{est.process_bytes / mib:,.1f} | {est.process_bytes_high / mib:,.1f} | {measured / mib:,.1f} | "
            f"{', '.join(f'{run / mib:,.0f}' for run in runs)} | {error:+.1%} | {'yes' if covered else '**no**'} |",
            covered, error)


def _measure_here(runs: int, only: str | None) -> list[dict]:
    from trainmem.calibrate import _cpu_name

    tag, facts = _this_cpu()
    records = []
    for label, hub, model_type, task, overrides, batch, seq, rank in ROWS:
        if only and only not in label:
            continue
        started = time.time()
        done = [_measure(model_type, task, overrides, batch, seq, rank) for _ in range(runs)]
        records.append({"tag": tag, "cpu": _cpu_name(), "as_cpu": facts, "label": label, "hub": hub,
                        "model_type": model_type, "task": task, "batch": batch, "seq": seq, "rank": rank, "steps": STEPS,
                        "runs_bytes": [run["hwm"] for run in done], "torch": done[0]["torch"],
                        "measured": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - started)})
        print(label, [run["hwm"] >> 20 for run in done], "MiB", flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--re-estimate", action="store_true", help="measure nothing: estimate every recorded "
                        "row again, each as for the CPU it was measured on")
    parser.add_argument("--only", help="measure only the rows whose label contains this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*json.loads(args.child))
        return
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    records = [json.loads(line) for line in DATA.read_text().splitlines()] if DATA.exists() else []
    if not args.re_estimate:
        fresh = _measure_here(args.runs, args.only)
        replaced = {(record["tag"], record["label"]) for record in fresh}
        records = [r for r in records if (r["tag"], r["label"]) not in replaced] + fresh
        DATA.write_text("".join(json.dumps(record) + "\n" for record in records))
    tables, covered, errors = [], 0, []
    for tag in dict.fromkeys(record["tag"] for record in records):
        mine = [record for record in records if record["tag"] == tag]
        lines = [_line(record) for record in mine]
        covered += sum(ok for _, ok, _ in lines)
        errors += [error for _, _, error in lines]
        tables += [f"### {mine[0]['cpu']} (`--as-cpu {mine[0]['as_cpu']}`), torch {mine[0]['torch']}, measured "
                   f"{mine[0]['measured']}", "",
                   "| setup | batch | seq | est. tensors MiB | est. RSS MiB | high MiB | measured MiB | runs MiB | error "
                   "| high ≥ every run |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
                   *[line for line, _, _ in lines], ""]
    text = "\n".join([
        "# Hugging Face fine-tuning on the CPU: peak RSS against the estimate", "",
        f"Estimated {time.strftime('%Y-%m-%d')} by `python benchmarks/hf_cpu_rss.py{' --re-estimate' if args.re_estimate else ''}` "
        f"(measurements: benchmarks/data/hf_cpu_rss.jsonl, one set per CPU; each row estimated as for the CPU it was "
        f"measured on). Measured: VmHWM of a fresh process that trains the model {STEPS} steps as a user writes it "
        "(this file's `_child`: transformers and peft only, 2 threads), median of the runs. Estimated: "
        f"`trainmem.estimate` of the same setup (its heap replay stands for the same {STEPS} steps).", "",
        f"- point estimate within 5%: **{sum(abs(e) <= 0.05 for e in errors)}/{len(errors)}**; worst "
        f"{min(errors, key=lambda e: -abs(e)):+.1%}",
        f"- high end at or above every run: **{covered}/{len(errors)}**", "", *tables, NOTE, ""])
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
