"""Published per-GPU memory figures of multi-GPU training runs beside trainmem's per-rank estimate and the published
formulas (ZeRO model states + Korthikanti et al.'s activations).

    .venv/bin/python benchmarks/accuracy_distributed.py            # formulas + the traced rows already recorded
    .venv/bin/python benchmarks/accuracy_distributed.py --trace    # trace every row (one subprocess each)
    .venv/bin/python benchmarks/accuracy_distributed.py --trace --only tt-8b-fsdp8 --timeout 900

Reads benchmarks/data/distributed_published.jsonl (every published number with its URL, table and row, quoted from
the source), writes benchmarks/data/accuracy_distributed.jsonl (one traced result or failure per row, with the
command's wall time) and benchmarks/results/accuracy_distributed.md. Each trace runs `trainmem.estimate(...)` in a
fresh process under a timeout, so a row that cannot be traced in reasonable time is reported, not dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "src"))

from trainmem.parallel.analytic import (activation_bytes_per_layer, deepspeed_zero3_model_states,  # noqa: E402
                                        megatron_activation_bytes, zero_model_states)

PUBLISHED = ROOT / "data" / "distributed_published.jsonl"
TRACED = ROOT / "data" / "accuracy_distributed.jsonl"
REPORT = ROOT / "results" / "accuracy_distributed.md"
GIB = 2**30

# Llama 3.1 405B is not in trainmem's bundled config table: its shape as torchtitan defines it
# (torchtitan/models/llama/__init__.py llama3_configs["405B"]: dim 16384, n_layers 126, n_heads 128, n_kv_heads 8,
# ffn_dim_multiplier 1.2, multiple_of 4096 -> FFN 4096 * ceil(1.2 * int(2 * 4 * 16384 / 3) / 4096) = 53,248),
# vocabulary 128,256 (the Llama 3 tokenizer), written as a transformers LlamaConfig.
LLAMA_405B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 16384,
              "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}


def shape_of(row: dict) -> dict:
    """hidden, heads, layers, vocab, FFN and parameter count of the row's model (bundled config or LLAMA_405B)."""
    if row["model"].startswith("hf:"):
        table = json.loads((ROOT.parent / "src/trainmem/frontends/data/hf_configs.json").read_text())
        config = table["models"][row["model"][3:]]["config"]
    else:
        config = LLAMA_405B
    h, ffn, layers, vocab = (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                             config["vocab_size"])
    kv = config.get("num_key_value_heads", config["num_attention_heads"])
    head = h // config["num_attention_heads"]
    per_layer = h * h * 2 + 2 * h * kv * head + 3 * h * ffn + 2 * h  # q, o, k, v, gate/up/down, two RMSNorms
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings") else 2)
    return {"hidden_size": h, "num_attention_heads": config["num_attention_heads"], "num_hidden_layers": layers,
            "vocab_size": vocab, "intermediate_size": ffn, "params": layers * per_layer + embeddings + h,
            "largest_layer_params": max(vocab * h, h * ffn)}


def formula(row: dict) -> tuple[int, str]:
    """(bytes, how): the published formulas for the row's setup. Model states: ZeRO P_os+g+p (16Ψ/N over the
    tensor/pipeline shard Ψ/(tp·pp)) for fp32 FSDP2 shards; DeepSpeed's ZeRO-3 offload figure (4 × the largest layer)
    with parameter offload; the bf16 frozen shard 2Ψ/N for LoRA. Activations: Korthikanti Table 2 via Megatron's sum."""
    shape, setup, layout = shape_of(row), row["setup"], row["layout"]
    dp, tp, pp = layout.get("dp", 1), layout.get("tp", 1), layout.get("pp", 1)
    psi = math.ceil(shape["params"] / (tp * pp))
    if layout.get("offload") == "params":
        _, states, _ = deepspeed_zero3_model_states(psi, shape["largest_layer_params"], min(dp, 8), math.ceil(dp / 8),
                                                    cpu_offload=True, cpu_offload_params=True)
        how = "DeepSpeed ZeRO-3 offload_param: 4 B × largest layer"
    elif setup.get("qlora"):
        states, how = math.ceil(psi / 2 / dp), "Ψ/2N NF4 frozen shard (4 bits; no published QLoRA formula)"
    elif setup.get("lora"):
        states, how = math.ceil(2 * psi / dp), "2Ψ/N bf16 frozen shard (no published LoRA formula)"
    else:
        states, how = zero_model_states(psi, dp, 3), "ZeRO P_os+g+p 16Ψ/N"
    s, b = setup["seq_len"], setup["batch_size"]
    m = layout.get("microbatches") or pp
    if pp > 1:
        b = max(1, b // m)
    recompute = "full" if setup.get("checkpointing") and "selective" not in row["published_settings"] else (
        "selective" if setup.get("checkpointing") else "none")
    per_layer = activation_bytes_per_layer(s, b, shape["hidden_size"], shape["num_attention_heads"], t=tp,
                                           sequence_parallel=tp > 1, recompute=recompute)
    acts = megatron_activation_bytes(s, b, shape["hidden_size"], math.ceil(shape["num_hidden_layers"] / pp) * pp,
                                     shape["vocab_size"], t=tp, p=pp, microbatches=m if pp > 1 else None,
                                     per_layer=per_layer,
                                     virtual=2 if layout.get("schedule") == "interleaved-1f1b" else None)
    return states + acts, f"{how} {states / GIB:.1f} + activations ({recompute}) {acts / GIB:.1f} GiB"


def _estimate_kwargs(row: dict, config_dir: Path) -> tuple[str, dict]:
    model = row["model"] if row["model"].startswith("hf:") else f"hf:{config_dir}"
    layout = dict(row["layout"])
    kwargs = {**row["setup"], **layout, "device": row["device"]}
    kwargs["world_size"] = layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1)
    return model, kwargs


CHILD = """
import json, sys, time
import trainmem
model, kwargs = json.loads(sys.argv[1])
start = time.perf_counter()
est = trainmem.estimate(model, **kwargs)
out = est.to_dict()
print("RESULT " + json.dumps({"peak": out["peak"], "breakdown": out["breakdown"], "ranks": out.get("ranks"),
                              "parallel": {k: v for k, v in (out.get("parallel") or {}).items() if k != "layout"},
                              "seconds": time.perf_counter() - start}))
"""


def trace_row(row: dict, timeout: int) -> dict:
    """The row's trace; for selective activation checkpointing (not modelled) also the trace without any, so that
    the two bracket it."""
    result = _run_child(row, timeout)
    if "selective" in row["published_settings"] and "error" not in result:
        bare = _run_child({**row, "setup": {**row["setup"], "checkpointing": False}}, timeout)
        result["no_ac"] = {k: bare[k] for k in ("peak", "error", "seconds", "wall_s") if k in bare}
    return result


def _run_child(row: dict, timeout: int) -> dict:
    """Run trainmem.estimate for the row in a fresh process; the result, or the failure's last line."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(LLAMA_405B))
        model, kwargs = _estimate_kwargs(row, Path(tmp))
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([model, kwargs])], capture_output=True,
                                  text=True, timeout=timeout, cwd=ROOT.parent)
        except subprocess.TimeoutExpired:
            return {"id": row["id"], "error": f"not traced: still running after {timeout} s", "wall_s": timeout}
    wall = round(time.perf_counter() - start, 1)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"id": row["id"], **json.loads(line[7:]), "wall_s": wall}
    tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return {"id": row["id"], "error": (tail[-1] if tail else f"exit {done.returncode}")[:300], "wall_s": wall}


def load_traced() -> dict[str, dict]:
    if not TRACED.exists():
        return {}
    return {r["id"]: r for r in map(json.loads, TRACED.read_text().splitlines()) if r}


def _cell(traced: dict | None, published: int) -> tuple[str, str, str]:
    if traced is None:
        return "not run yet", "", ""
    if "error" in traced:
        return f"not traced ({traced['wall_s']} s): {traced['error']}", "", ""
    reserved = traced["peak"]["reserved_bytes"]
    value, error, seconds = f"{reserved / GIB:.1f}", f"{(reserved - published) / published:+.0%}", \
        f"{traced['seconds']:.0f} s"
    bare = traced.get("no_ac")
    if bare and "peak" in bare:
        other = bare["peak"]["reserved_bytes"]
        value += f" (full AC) – {other / GIB:.1f} (no AC)"
        error += f" – {(other - published) / published:+.0%}"
        seconds += f" + {bare['seconds']:.0f} s"
    elif bare:
        value += f" (full AC); no AC: {bare.get('error', 'failed')}"
    return value, error, seconds


def render(rows: list[dict], traced: dict[str, dict]) -> str:
    lines = ["# Distributed accuracy: published per-GPU figures", "",
             "Generated by `benchmarks/accuracy_distributed.py` from `benchmarks/data/distributed_published.jsonl` "
             "(every published number quoted from the source named in its row) and "
             "`benchmarks/data/accuracy_distributed.jsonl` (trainmem's traces). GiB = 2^30 B. *trainmem* is the most "
             "loaded rank's estimated `reserved_bytes` (torch.cuda.max_memory_reserved), the counter torchtitan "
             "logs; *formula* is the published formulas for the same setup (ZeRO model states + Korthikanti et al. "
             "activations, `trainmem.parallel.analytic`), which know nothing of the allocator, the loss or the "
             "optimizer's temporaries.", "",
             "| row | published | trainmem (reserved) | error | trace time | formula | formula terms | published settings | what differs |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for row in rows:
        value, error, seconds = _cell(traced.get(row["id"]), row["published_bytes"])
        total, how = formula(row)
        lines.append(f"| {row['id']} | {row['published']} | {value} | {error} | {seconds} | {total / GIB:.1f} | {how} "
                     f"| {row['published_settings']} | {_differs(row)} |")
    lines += ["", "## Summary", "", *_summary(rows, traced), "", "## Sources", ""]
    for row in rows:
        lines.append(f"- **{row['id']}**: {row['source']} — {row['where']}. Counter: {row['counter']}. "
                     f"Hardware: {row['hardware']}. Config: {row['config']}.")
    return "\n".join(lines) + "\n"


def _error(traced: dict, row: dict) -> float:
    return (traced["peak"]["reserved_bytes"] - row["published_bytes"]) / row["published_bytes"]


def _summary(rows: list[dict], traced: dict[str, dict]) -> list[str]:
    """Counts computed from the rows: how many were traced, the errors, and whether a selective-AC row's published
    figure lies between its full-AC and no-AC traces."""
    ok = [r for r in rows if "peak" in traced.get(r["id"], {})]
    failed = [r["id"] for r in rows if "error" in traced.get(r["id"], {})]
    out = [f"- {len(ok)} of {len(rows)} published rows traced; not traced: {', '.join(failed) or 'none'}"
           + ("; not run: " + ", ".join(r["id"] for r in rows if r["id"] not in traced)
              if any(r["id"] not in traced for r in rows) else "") + "."]
    bracket = [r for r in ok if "peak" in traced[r["id"]].get("no_ac", {})]
    inside = [r for r in bracket if traced[r["id"]]["peak"]["reserved_bytes"] <= r["published_bytes"]
              <= traced[r["id"]]["no_ac"]["peak"]["reserved_bytes"]]
    if bracket:
        out.append(f"- Selective activation checkpointing (torchtitan's per-op policy) is not modelled: the published "
                   f"figure lies between trainmem's full-AC and no-AC traces in {len(inside)} of {len(bracket)} rows.")
    direct = [r for r in ok if r not in bracket]
    if direct:
        errors = ", ".join(f"{r['id']} {_error(traced[r['id']], r):+.0%}" for r in direct)
        out.append(f"- Rows traced as published (no bracket): {errors}. Each row's last column says what differs "
                   "(torch.compile, float8, chunked loss, the counter).")
    return out


def _differs(row: dict) -> str:
    notes = []
    text = row["published_settings"]
    if "torch.compile" in text:
        notes.append("torch.compile fuses and frees activations earlier; trainmem traces eager")
    if "float8" in text:
        notes.append("float8 linears save fp8 copies; trainmem traces bf16")
    if "selective" in text:
        notes.append("selective per-op AC is not modelled: traced with full per-block checkpointing (fewer saved "
                     "activations than selective)")
    if "async TP" in text:
        notes.append("async TP's symmetric-memory buffers are not modelled")
    if row["layout"].get("tp", 1) > 1:
        notes.append("trainmem applies the Hugging Face model's own TP plan (LlamaForCausalLM: colwise/rowwise "
                     "projections, lm_head colwise_gather_output): no sequence parallelism, so every rank keeps each "
                     "layer's whole input, and the logits are gathered whole before the loss; torchtitan shards "
                     "norms and layer inputs over the sequence (SequenceParallel) and computes the loss on "
                     "vocabulary shards (loss parallel): a different program, far leaner in activations")
    if row["id"].startswith("tt-"):
        notes.append("torchtitan's FSDP2 MixedPrecisionPolicy (bf16 compute params) traced as autocast bf16-mixed")
    if row["id"].startswith("tune-"):
        notes.append("counter not stated; CEWithChunkedOutputLoss chunks the logits, trainmem runs the model's own loss")
    return "; ".join(notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help="trace the rows (one subprocess each)")
    parser.add_argument("--only", nargs="*", help="row ids to trace")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per traced row")
    args = parser.parse_args()
    rows = [json.loads(line) for line in PUBLISHED.read_text().splitlines() if line.strip()]
    traced = load_traced()
    if args.trace:
        done: dict[str, dict] = {}  # rows whose traced setup is the same (compile, float8 differ only in notes)
        for row in rows:
            if args.only and row["id"] not in args.only:
                continue
            key = json.dumps([row["model"], row["setup"], row["layout"], row["device"],
                              "selective" in row["published_settings"]], sort_keys=True)
            if key not in done:
                done[key] = trace_row(row, args.timeout)
            traced[row["id"]] = {**done[key], "id": row["id"]}
            print(row["id"], {k: v for k, v in traced[row["id"]].items() if k in ("error", "wall_s", "peak", "no_ac")},
                  flush=True)
            TRACED.write_text("".join(json.dumps(traced[r["id"]]) + "\n" for r in rows if r["id"] in traced))
    REPORT.write_text(render(rows, traced))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
