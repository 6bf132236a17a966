"""Derive the runtime small-object table (src/trainmem/targets/data/cpu_small_objects.json) from malloc
logs of real training runs; alloc/small_objects.py explains what the table holds and why.

For each calibration case: run the real steps in a fresh process under the LD_PRELOAD shim
(benchmarks/glibc/malloc_log.c, logging on around the steps only), trace the same setup, and align
the log's tensor allocations (64-byte posix_memalign requests of the sizes the trace allocates, in
order, within a window) with the estimate's stream. Every other allocation of the main thread is a
runtime object: it is attributed to the tensor allocation before it (op, phase, first step or later),
and its free is placed on the stream by the tensor event before it. Other threads' allocations go to
glibc's thread arenas and are left out, as are unmatched aligned requests above MAX_OBJECT (tensors
the alignment missed). Held-out models are not calibrated on: benchmarks/glibc_fidelity.py and
tests/test_measured.py check them.

    python benchmarks/calibrate_small_objects.py          # needs gcc; a few minutes on 2 cores
    python benchmarks/calibrate_small_objects.py transformers  # one family's rows, the others kept
    python benchmarks/calibrate_small_objects.py --check  # held-out models against real runs
"""

from __future__ import annotations

import collections
import datetime
import difflib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from glibc_fidelity import CHILD, build, records  # noqa: E402
from trainmem.alloc import small_objects  # noqa: E402
from trainmem.alloc.small_objects import DATA, row_key, segments  # noqa: E402

ZOO = f"{ROOT}/tests/models.py"
LLAMA = f"{ROOT}/tests/data/tiny_llama"
CALIBRATION = [("mlp:1000-100-100-100-100-10", {"batch_size": 256, "optimizer": "adam", "input_shape": "1000"}),
               ("mlp:1000-100-100-100-100-10", {"batch_size": 2048, "optimizer": "adam", "input_shape": "1000"}),
               (f"{ZOO}:cnn_bn", {"batch_size": 16, "optimizer": "adam"}),
               (f"{ZOO}:cnn_bn", {"batch_size": 64, "optimizer": "momentum"}),
               (f"{ZOO}:resnet_small", {"batch_size": 8, "optimizer": "adam"}),
               (f"{ZOO}:resnet_small", {"batch_size": 32, "optimizer": "momentum"}),
               (f"{ZOO}:tiny_gpt", {"batch_size": 4, "optimizer": "adam"}),
               (f"{ZOO}:tiny_gpt", {"batch_size": 16, "optimizer": "momentum"}),
               (f"{ZOO}:lstm", {"batch_size": 8, "optimizer": "adam"}),
               (f"{ZOO}:lstm", {"batch_size": 32, "optimizer": "momentum"})]
# transformers models run their own Python between ops (alloc/small_objects.py "Families"): a decoder (RMSNorm,
# rotary, SiLU, bias-free projections), with and without LoRA, and an encoder (LayerNorm, GELU, biases, the
# masked-LM head). GPT-2 and the other rows of benchmarks/hf_cpu_rss.py stay held out.
TRANSFORMERS = [(f"hf:{LLAMA}", {"batch_size": 8, "seq_len": 128, "optimizer": "adam"}),
                (f"hf:{LLAMA}", {"batch_size": 4, "seq_len": 256, "optimizer": "adam", "lora": "r=4"}),
                ("hf:distilbert/distilbert-base-uncased", {"batch_size": 8, "seq_len": 128, "optimizer": "adam"})]
FAMILIES = {"torch": CALIBRATION, "transformers": TRANSFORMERS}
WINDOW = 24  # how far (in tensor allocations) a small request may stray from the trace's order
ANCHOR = 4096  # requests this large are aligned as a sequence
MAX_OBJECT = 32 * 1024  # larger unmatched aligned requests are tensors the alignment missed
MIN_RATE = 0.002  # templates rarer than this per tensor allocation are dropped (the total is reported)


def estimate_stream(ref: str, values: dict):
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.targets import cpu_kernels as cpu_target
    from trainmem.targets.cpu_info import CpuInfo
    from trainmem.trace.run import trace_training

    setup = TrainingSetup.from_mapping(values)
    traced = trace_training(resolve(ref, setup), setup, cpu_target.kernel_ops())
    return cpu_target.device_stream(traced.trace, CpuInfo.this_machine())[0]


def logged_run(shim: Path, tmp: Path, ref: str, values: dict) -> list[tuple]:
    log = tmp / "malloc.log"
    env = {**os.environ, "LD_PRELOAD": str(shim), "MLOG": str(log), "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-c", CHILD, str(shim), ref, json.dumps(values)], env=env, check=True,
                   capture_output=True)
    return records(log)


def anchors(recs: list[tuple], stream, allocs: list[int]) -> dict[int, int]:
    """Log record index -> stream allocation ordinal for requests of at least ANCHOR bytes: the longest
    matching subsequence of the two size sequences (difflib), which a missing or extra request cannot
    derail."""
    logged = [i for i, r in enumerate(recs) if r[0] == b"a" and r[2] == 64 and r[3] >= ANCHOR]
    traced = [k for k, i in enumerate(allocs) if stream[i].nbytes >= ANCHOR]
    matcher = difflib.SequenceMatcher(None, [recs[i][3] for i in logged], [stream[allocs[k]].nbytes for k in traced],
                                      autojunk=False)
    return {logged[block.a + n]: traced[block.b + n] for block in matcher.get_matching_blocks()
            for n in range(block.size)}


def match_small(queue, cursor: int, taken: set) -> int | None:
    while queue and (queue[0] in taken or queue[0] < cursor - WINDOW):
        queue.popleft()
    return queue.popleft() if queue and queue[0] <= cursor + WINDOW else None


def align(recs: list[tuple], stream) -> list[tuple]:
    """The log as ('T', stream index) tensor allocs, ('t', stream index of its free) tensor frees,
    ('s', id, size, aligned, main thread) object allocs and ('x', id) object frees. Large requests are
    aligned by anchors(); a small one takes the next unmatched trace allocation of its size near the
    last match."""
    allocs = [i for i, e in enumerate(stream) if e.action == "alloc" and e.nbytes > 0 and str(e.phase) != "init"]
    free_at = {e.key: i for i, e in enumerate(stream) if e.action == "free"}
    by_size: dict[int, collections.deque] = collections.defaultdict(collections.deque)
    for ordinal, index in enumerate(allocs):
        by_size[stream[index].nbytes].append(ordinal)
    anchored = anchors(recs, stream, allocs)
    main_thread = collections.Counter(r[4] for r in recs).most_common(1)[0][0]
    out, live, cursor, ids, taken = [], {}, 0, 0, set(anchored.values())
    for position, (op, address, extra, nbytes, tid) in enumerate(recs):
        ordinal = anchored.get(position)
        if ordinal is None and op == b"a" and extra == 64 and nbytes < ANCHOR:
            ordinal = match_small(by_size.get(nbytes), cursor, taken)
        if ordinal is not None:
            taken.add(ordinal)
            cursor = ordinal if position in anchored else max(cursor, min(ordinal, cursor + 2))
            live[address] = ("T", allocs[ordinal])
            out.append(live[address])
            continue
        if op == b"r" and (old := live.pop(extra, None)) and old[0] == "S":
            out.append(("x", old[1]))
        if op in (b"m", b"a", b"r"):
            ids += 1
            live[address] = ("S", ids)
            out.append(("s", ids, nbytes, op == b"a", tid == main_thread))
        elif op == b"f" and (known := live.pop(address, None)):
            out.append(("x", known[1]) if known[0] == "S" else ("t", free_at.get(stream[known[1]].key, -1)))
    return out


def lifetime(birth: int, last: tuple | None, runs, owner) -> list | None:
    """How the stream places an object's free ("transient": before the next tensor event)."""
    if last is None or last[1] < 0:
        return ["never"]
    death = last[1]
    if death == birth and last[0] == "T":
        return ["transient"]
    if owner[death] == owner[birth]:
        return ["same", 2 ** round(math.log2(max(death - birth, 1)))]
    step, phase, start, end = runs[owner[death]]
    return ["phase", phase, step - runs[owner[birth]][0], (death - start) * 4 // (end - start + 1)]


def objects(out: list[tuple], stream) -> tuple[list[tuple], collections.Counter]:
    """(birth stream index, size, aligned, lifetime) of the main thread's runtime objects, and what was
    left out (other threads' arenas, objects before the first tensor, aligned requests too large to be
    runtime objects) in bytes."""
    runs, owner = segments(stream)
    born, found, left_out, context, last = {}, [], collections.Counter(), None, None
    for event in out:
        if event[0] in ("T", "t"):
            last = event
            context = event[1] if event[0] == "T" else context
        elif event[0] == "s":
            born[event[1]] = (event[2:], context, last)
        elif event[1] in born:
            found.append((*born.pop(event[1]), last))
    found += [(*value, None) for value in born.values()]
    kept = []
    for (nbytes, aligned, main), birth, seen, death in found:
        life = None if birth is None else lifetime(birth, death if death != seen else ("T", birth), runs, owner)
        if death is not None and death[0] == "t" and birth is not None and death[1] >= 0 \
                and stream[death[1]].key == stream[birth].key:
            life = ["companion"]
        reason = ("other thread" if not main else "before the first tensor" if birth is None else
                  "aligned, larger than MAX_OBJECT" if aligned and nbytes > MAX_OBJECT else "")
        if reason:
            left_out[reason] += nbytes
        else:
            kept.append((birth, nbytes, aligned, life))
    return kept, left_out


def row_keys(stream) -> list[str | None]:
    first = min((e.step for e in stream if str(e.phase) != "init"), default=0)
    return [row_key(e.op, str(e.phase), e.step == first) if e.action == "alloc" and str(e.phase) != "init" else None
            for e in stream]


def add_case(totals: dict, stream, kept: list[tuple]) -> None:
    """Count tensor allocations and objects per row, and per phase ('*' rows, for ops not in the table).
    Objects never freed are caches (oneDNN's primitive cache and the like, keyed by shapes): they are
    counted per first allocation of an (op, phase, bytes) signature, not per allocation."""
    keys, firsts = row_keys(stream), small_objects.first_signatures(stream)
    for index, key in enumerate(keys):
        for row in (key, "*|" + key.split("|", 1)[1]) if key else ():
            totals[row]["allocs"] += 1
            totals[row]["firsts"] += index in firsts
    for birth, nbytes, aligned, life in kept:
        life = ["cached"] if life == ["never"] else life
        template = json.dumps([nbytes, int(aligned), life])
        for row in (keys[birth], "*|" + keys[birth].split("|", 1)[1]):
            totals[row]["objects"][template] += 1


def table_rows(totals: dict) -> tuple[dict, dict, float]:
    ops, phases, dropped = {}, {}, 0.0
    for key, row in sorted(totals.items()):
        templates = []
        for template, count in sorted(row["objects"].items(), key=lambda item: -item[1]):
            cached = json.loads(template)[2] == ["cached"]
            rate = count / (row["firsts"] if cached else row["allocs"]) if (row["firsts"] or not cached) else 0
            if rate < MIN_RATE:
                dropped += count * json.loads(template)[0]
                continue
            templates.append([*json.loads(template), round(rate, 4)])
        (phases if key.startswith("*|") else ops)[key] = {"allocs": row["allocs"], "firsts": row["firsts"],
                                                          "objects": templates}
    return ops, phases, dropped


def calibrate(cases: list, shim: Path, tmp: Path) -> dict:
    """One family's rows: {"source", "ops", "phases"} from the malloc logs of its cases."""
    import torch

    totals: dict = collections.defaultdict(lambda: {"allocs": 0, "firsts": 0, "objects": collections.Counter()})
    left_out: collections.Counter = collections.Counter()
    for ref, values in cases:
        stream = estimate_stream(ref, values)
        kept, skipped = objects(align(logged_run(shim, tmp, ref, values), stream), stream)
        add_case(totals, stream, kept)
        left_out.update(skipped)
        print(ref.rsplit("/", 1)[-1], values["batch_size"], len(kept), "objects", dict(skipped), flush=True)
    ops, phases, dropped = table_rows(totals)
    source = {"command": "python benchmarks/calibrate_small_objects.py", "date": str(datetime.date.today()),
              "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
              "threads": torch.get_num_threads(), "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
              "runs": [f"{ref.rsplit('/', 1)[-1]} {json.dumps(values)}" for ref, values in cases],
              "left_out_bytes": dict(left_out), "dropped_rare_bytes": int(dropped),
              "format": "row 'op|phase|first|later': allocs = tensor allocations seen; objects = "
                        "[request bytes, posix_memalign(64)?, lifetime, objects per tensor allocation (cached: per first "
                        "allocation of an (op, phase, bytes) signature)]"}
    return {"source": source, "ops": ops, "phases": phases}


def main(families: list[str]) -> None:
    """Calibrate `families` (alloc/small_objects.py), keeping the others' rows and the spread as they are."""
    old = json.loads(DATA.read_text()) if DATA.exists() else {}
    rows = {"torch": {key: old[key] for key in ("source", "ops", "phases") if key in old}, **old.get("families", {})}
    with tempfile.TemporaryDirectory() as tmpdir:
        shim, _ = build(Path(tmpdir))
        for family in families:
            rows[family] = calibrate(FAMILIES[family], shim, Path(tmpdir))
    table = {**rows["torch"], "families": {name: rows[name] for name in FAMILIES if name != "torch" and name in rows},
             "spread": old.get("spread")}  # the spread is measured apart: kept
    DATA.write_text(json.dumps(table, indent=0) + "\n")
    print(f"wrote {DATA}: " + ", ".join(f"{name} {len(rows[name]['ops'])} op rows" for name in FAMILIES if name in rows))


HELD_OUT = [("gru", 32), ("gru", 8), ("unet", 16), ("unet", 4), ("conv3d_net", 16), ("bigru", 32),
            ("mobilenet_like", 32), ("transformer_encoder", 32), ("depthwise_gn", 32), ("conv_autoencoder", 32),
            ("frozen_backbone", 64), ("einsum_attention", 16), ("tied_lm", 8), ("embbag_recsys", 512)]


def check(runs: int = 3) -> None:
    """Held-out models (not in CALIBRATION): estimate vs the median and max peak RSS of `runs` fresh
    processes of benchmarks/truth_loops.py (plain PyTorch, no trainmem code), Adam, inline loop."""
    import statistics

    from trainmem import estimate

    mib = 2**20
    print("| model | batch | estimate MiB | high MiB | median MiB (runs) | error | high vs max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, batch in HELD_OUT:
        measured = [json.loads(subprocess.run(
            [sys.executable, str(ROOT / "benchmarks/truth_loops.py"), f"{ZOO}:{name}", "--batch-size", str(batch),
             "--optimizer", "adam", "--mode", "rss"], capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        )["peak_rss_bytes"] for _ in range(runs)]
        est = estimate(f"{ZOO}:{name}", batch_size=batch, optimizer="adam")
        median = statistics.median(measured)
        print(f"| {name} | {batch} | {est.process_bytes / mib:.1f} | {est.process_bytes_high / mib:.1f} | "
              f"{median / mib:.1f} ({', '.join(f'{m / mib:.0f}' for m in measured)}) | "
              f"{est.process_bytes / median - 1:+.1%} | {est.process_bytes_high / max(measured) - 1:+.1%} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    else:  # python benchmarks/calibrate_small_objects.py [FAMILY ...] (default: every family)
        unknown = sorted(set(sys.argv[1:]) - set(FAMILIES))
        if unknown:
            sys.exit(f"expected families among {', '.join(FAMILIES)}, got {', '.join(unknown)}")
        main(sys.argv[1:] or list(FAMILIES))
