"""How faithful is trainmem's glibc model, and what does it leave out?

For each model: run the real training steps with an LD_PRELOAD shim that logs every malloc/free
(benchmarks/glibc/malloc_log.c), then replay the log through this machine's real glibc
(benchmarks/glibc/glibc_replay.c, touching every byte) twice: the tensor allocations alone (c10's
64-byte posix_memalign calls) and the whole log (tensors + the C++/Python runtime's small objects).
Beside them: trainmem's GlibcModel on the same tensor-only log, and on the estimate's own stream.
Needs gcc. Writes benchmarks/results/glibc_fidelity.md.

    python benchmarks/glibc_fidelity.py
"""

from __future__ import annotations

import datetime
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.alloc import small_objects  # noqa: E402
from trainmem.alloc.cpu_heap import GlibcModel, replay_actions, replay_resident  # noqa: E402
from trainmem.frontends import resolve  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402
from trainmem.targets import cpu_kernels as cpu_target  # noqa: E402
from trainmem.targets.cpu_info import CpuInfo  # noqa: E402
from trainmem.trace.run import trace_training  # noqa: E402

CASES = [("mlp:1000-100-100-100-100-10", {"batch_size": 2048, "optimizer": "adam", "input_shape": "1000"}),
         (f"{ROOT}/tests/models.py:cnn_bn", {"batch_size": 64, "optimizer": "adam"}),
         (f"{ROOT}/tests/models.py:resnet_small", {"batch_size": 16, "optimizer": "adam"}),
         (f"{ROOT}/tests/models.py:tiny_gpt", {"batch_size": 8, "optimizer": "adam"}),
         (f"{ROOT}/tests/models.py:lstm", {"batch_size": 32, "optimizer": "adam"})]
RECORD = struct.Struct("<c7xQQQQ")
CHILD = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
from trainmem.frontends import resolve
from trainmem.setup import TrainingSetup
from trainmem.trace import finetune, step as training
setup = TrainingSetup.from_mapping(json.loads(sys.argv[3]))
source = resolve(sys.argv[2], setup)
model, make_batch, loss_fn = training.unpack_built(source.build(), source)
model, _ = finetune.apply(model, setup)  # --lora / --qlora, as measure/child.py and the trace apply them
prepared = training.prepare(model, make_batch, loss_fn, setup, source)
lib.mlog_enable(1)
training.run_steps(prepared, setup, training.Observer())
lib.mlog_enable(0)
"""


def build(tmp: Path) -> tuple[Path, Path]:
    shim, replayer = tmp / "libmalloc_log.so", tmp / "glibc_replay"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", shim, ROOT / "benchmarks/glibc/malloc_log.c", "-ldl"], check=True)
    subprocess.run(["gcc", "-O2", "-o", replayer, ROOT / "benchmarks/glibc/glibc_replay.c"], check=True)
    return shim, replayer


def records(log: Path) -> list[tuple]:
    data = log.read_bytes()
    return [RECORD.unpack_from(data, i * RECORD.size) for i in range(len(data) // RECORD.size)]


def tensor_only(recs: list[tuple]) -> list[tuple]:
    live, out = set(), []
    for rec in recs:
        op, address, alignment = rec[0], rec[1], rec[2]
        if op == b"a" and alignment == 64:
            live.add(address)
            out.append(rec)
        elif op == b"f" and address in live:
            live.discard(address)
            out.append(rec)
    return out


def model_peak(recs: list[tuple]) -> int:
    glibc, keys = GlibcModel(), {}
    for key, (op, address, old, size, _) in enumerate(recs):
        if op == b"r" and old in keys:
            glibc.free(keys.pop(old))
        if op in (b"m", b"a", b"r") and address:
            keys[address] = key
            if op == b"a":
                glibc.malloc(key, size, old)  # posix_memalign: `old` holds the alignment
            else:
                glibc.malloc_plain(key, size)
        elif op == b"f" and address in keys:
            glibc.free(keys.pop(address))
    return glibc.peak_resident


def real_peak(replayer: Path, recs: list[tuple], tmp: Path) -> int:
    path = tmp / "replay.bin"
    path.write_bytes(b"".join(RECORD.pack(*rec) for rec in recs))
    out = subprocess.run([replayer, path, "touch"], capture_output=True, text=True, check=True).stdout
    return int(float(out.split("above base ")[1].split(" MiB")[0]) * 2**20)


def main() -> None:
    import torch

    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        shim, replayer = build(tmp)
        for ref, values in CASES:
            log = tmp / "malloc.log"
            env = {**os.environ, "LD_PRELOAD": str(shim), "MLOG": str(log), "PYTHONPATH": str(ROOT / "src")}
            subprocess.run([sys.executable, "-c", CHILD, str(shim), ref, json.dumps(values)], env=env, check=True,
                           capture_output=True)
            recs = records(log)
            tensors = tensor_only(recs)
            setup = TrainingSetup.from_mapping(values)
            traced = trace_training(resolve(ref, setup), setup, cpu_target.kernel_ops())
            stream, _ = cpu_target.device_stream(traced.trace, CpuInfo.this_machine())
            row = {"model": ref.rsplit("/", 1)[-1], "batch": values["batch_size"],
                   "glibc_tensors": real_peak(replayer, tensors, tmp), "model_tensors": model_peak(tensors),
                   "glibc_all": real_peak(replayer, recs, tmp), "model_all": model_peak(recs),
                   "estimate_stream": replay_resident(stream),
                   "estimate_objects": replay_actions(small_objects.interleave(stream).actions),
                   "estimate_pinned": replay_actions(small_objects.interleave(stream).actions, pinned=True),
                   "small_allocations": len(recs) - len(tensors)}
            rows.append(row)
            print(row, flush=True)
    mib = 2**20
    lines = ["# glibc model fidelity", "",
             f"Generated {datetime.date.today()} by `python benchmarks/glibc_fidelity.py` (torch {torch.__version__}, "
             f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads). Peak resident MiB above "
             "the start of the replay.", "",
             "| model | batch | real glibc, tensors only | trainmem model, same log | real glibc, whole log | "
             "trainmem model, whole log | trainmem model, estimate stream | estimate stream + small-object table | "
             "same, every freed chunk pinned (high) | runtime small allocations |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['glibc_tensors'] / mib:.1f} | {r['model_tensors'] / mib:.1f} | "
                     f"{r['glibc_all'] / mib:.1f} | {r['model_all'] / mib:.1f} | {r['estimate_stream'] / mib:.1f} | "
                     f"{r['estimate_objects'] / mib:.1f} | {r['estimate_pinned'] / mib:.1f} | "
                     f"{r['small_allocations']:,} |")
    lines += ["", "Given the same allocations, the model follows real glibc (columns 3–4 and 5–6). Column 7 replays "
              "the estimate's tensor stream alone; column 8 interleaves the runtime's small objects as the table "
              "derived from malloc logs says (alloc/small_objects.py, targets/data/cpu_small_objects.json, "
              "`python benchmarks/calibrate_small_objects.py`), which is what `process_bytes` uses; column 9 is "
              "the same replay with every freed chunk pinned, one of the two bounds of `process_bytes_high`. "
              "The gap between columns 3 and 5 is the runtime's small objects pinning freed tensor chunks; their placement "
              "changes from run to run, so the whole-log columns vary between runs of this script.", ""]
    (ROOT / "benchmarks/results/glibc_fidelity.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
