"""How long an estimate takes, how much memory the estimating process needs, and what the trace's own
bookkeeping costs per op above FakeTensorMode's.

Each command runs N times as a fresh process (wall clock; peak RSS from wait4's rusage, as
`/usr/bin/time -v` reports it); the table gives medians (min–max). Ratios (the seed MLP call against
`import torch`, `fit` against one estimate) compare medians measured in the same run, since this
machine's speed drifts with its load.

The per-op table runs the same training steps in this process twice, alternately: under FakeTensorMode
alone (the steps trainmem runs, with an observer that does nothing) and as trainmem traces them
(trainmem's FakeTensorMode subclass with its cheaper cache keys, trace/fake_cache.py, the recorder above it,
the module tracker and the recording observer: trace/run.py).
It counts the ops the recorder saw (every dispatch, `prim.device` queries included) and divides each
CPU time (process_time: this process only, less sensitive to other processes than wall time) by it;
the recorder's overhead is the difference. Both include building the model on fake tensors.

    python benchmarks/speed.py [--runs 5] [--long-runs 3]
    python benchmarks/speed.py --only plan [--plan-runs 3]   # only `trainmem plan`'s rows, merged into speed.md
    python benchmarks/speed.py --only estimates [--runs 5] [--long-runs 3]   # all but the plan section, kept as is
Targets (issue 24): the seed MLP CLI call at most 1.3 × `import torch` (its row keeps the older < 3 s beside it); the 1.3B GPT-style estimate in ≤ 2 s
with < 1 GiB peak RSS, and at most 0.15 × the time PyTorch's MemTracker takes on the same setup
(benchmarks/memtracker_peer.py, run here as a fresh process like the others); a 2-layer bidirectional GRU on
200-token sequences, batch 64, at most 3 × `import torch`; a 70B model from its configuration in ≤ 3 s with
< 1 GiB; the recorder's overhead under 25 % of FakeTensorMode's own per-op cost; the Keras seed MLP at most 1.5 ×
`import tensorflow`; `trainmem plan` of a 70B model on up to 1,024 GPUs in < 2 min with every layout evaluated,
and every layout of it on 8 GPUs in ≤ 60 s (PLAN_FULL, timed again answered from the trace cache).

The plan section (`## trainmem plan`) runs each plan command as fresh processes, medians of --plan-runs;
`--only plan` replaces that section of an existing speed.md and leaves every other row as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINMEM = [sys.executable, "-m", "trainmem"]
# the cases below trace every time (--no-cache): the cost of a question not asked before; the cache's own section
# (cached_section) times the same commands answered from a trace stored by one run before them
NO_CACHE = ["--no-cache"]
GPT_1B3 = f"{ROOT}/tests/models.py:gpt_1b3"
# benchmarks/fit_examples.py's GPT setup on an 80 GB card, and one estimate of it at batch 1
GPT_FIT = [GPT_1B3, "--input-shape", "1024", "--input-dtype", "int64", "--input-max", "50257",
           "--optimizer", "adamw", "--precision", "bf16-mixed", "--device", "a100-80gb"]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    command: list[str]
    wall_target: float | None = None  # seconds
    rss_target: int | None = None  # bytes
    long: bool = False  # run --long-runs times, not --runs


SEED_MLP = "seed MLP (whole CLI call)"
IMPORT_TORCH = "import torch alone (for scale)"
FIT_GPT = "fit: GPT-style 1.3B on a100-80gb (benchmarks/fit_examples.py)"
ONE_GPT = "one estimate of that setup at batch 1"
GPT_ESTIMATE = "GPT-style 1.3B, seq 1024, batch 8, AdamW, bf16-mixed"
GRU_ESTIMATE = "2-layer bidirectional GRU, seq 200, batch 64, Adam (benchmarks/speed_models.py:bigru_seq200)"
MEMTRACKER = "the peer: PyTorch's MemTracker, the same 1.3B setup, two steps on fake tensors (benchmarks/memtracker_peer.py)"
KERAS_MLP = "Keras seed MLP (whole CLI call, --framework keras)"
IMPORT_TF = "import tensorflow alone (for scale)"
# issue 24's targets stated as ratios to a median of this run: (case, base case, at most)
RATIO_TARGETS = [(SEED_MLP, IMPORT_TORCH, 1.3), (GRU_ESTIMATE, IMPORT_TORCH, 3.0), (GPT_ESTIMATE, MEMTRACKER, 0.15),
                 (KERAS_MLP, IMPORT_TF, 1.5)]
CASES = [
    Case(SEED_MLP, TRAINMEM + ["estimate", "mlp:1000-100-100-100-100-10", "--input-shape", "1000",
                               "--batch-size", "256", "--optimizer", "adam", *NO_CACHE], 3.0),
    Case(IMPORT_TORCH, [sys.executable, "-c", "import torch"]),
    Case(KERAS_MLP, TRAINMEM + ["estimate", "mlp:1000-100-100-100-100-10", "--framework", "keras", "--input-shape",
                                "1000", "--batch-size", "256", "--optimizer", "adam", *NO_CACHE]),
    Case(IMPORT_TF, [sys.executable, "-c", "import tensorflow"]),
    Case(GPT_ESTIMATE,
         TRAINMEM + ["estimate", GPT_1B3, "--batch-size", "8", "--optimizer", "adamw", "--precision", "bf16-mixed",
                     *NO_CACHE],
         2.0, 2**30, long=True),
    Case(MEMTRACKER, [sys.executable, str(ROOT / "benchmarks/memtracker_peer.py")], long=True),
    Case(GRU_ESTIMATE,
         TRAINMEM + ["estimate", f"{ROOT}/benchmarks/speed_models.py:bigru_seq200", "--batch-size", "64",
                     "--optimizer", "adam", *NO_CACHE], long=True),
    Case("Llama-3.1-70B from the bundled config, seq 2048, batch 1, AdamW, bf16-mixed, on h100-80gb",
         TRAINMEM + ["estimate", "hf:meta-llama/Llama-3.1-70B", "--seq-len", "2048", "--optimizer", "adamw",
                     "--precision", "bf16-mixed", "--device", "h100-80gb", *NO_CACHE], 3.0, 2**30, long=True),
    Case("Llama-3.1-70B from the bundled config, seq 2048, AdamW, bf16-mixed, FSDP with tp 2 on 8 x h100-80gb (a rank "
         "role traced from 3 and 4 blocks)",
         TRAINMEM + ["estimate", "hf:meta-llama/Llama-3.1-70B", "--seq-len", "2048", "--optimizer", "adamw",
                     "--precision", "bf16-mixed", "--device", "h100-80gb", "--strategy", "fsdp", "--world-size", "8",
                     "--tp", "2", *NO_CACHE], long=True),
    Case("BERT-base masked LM on a100-40gb (the GPU calibration point)",
         TRAINMEM + ["estimate", "hf:bert-base-uncased", "--batch-size", "2", "--seq-len", "16", "--optimizer", "adamw",
                     "--device", "a100-40gb", *NO_CACHE], long=True),
    Case(FIT_GPT, TRAINMEM + ["fit", *GPT_FIT, *NO_CACHE], long=True),
    Case(ONE_GPT, TRAINMEM + ["estimate", *GPT_FIT, "--batch-size", "1", *NO_CACHE], long=True),
]
# (label, model reference, setup values) for the per-op table
PER_OP = [
    ("seed MLP, batch 256, Adam", "mlp:1000-100-100-100-100-10",
     {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}),
    ("2-layer bidirectional GRU, seq 64, batch 64, Adam", f"{ROOT}/tests/models.py:bigru",
     {"batch_size": 64, "optimizer": "adam"}),
    ("GPT-style 1.3B, seq 1024, batch 8, AdamW, bf16-mixed", GPT_1B3,
     {"batch_size": 8, "optimizer": "adamw", "precision": "bf16-mixed"}),
]
RECORDER_TARGET = 0.25  # the recorder's own cost per op, as a fraction of FakeTensorMode's
LLAMA_70B = ["hf:meta-llama/Llama-3.1-70B", "--seq-len", "2048", "--optimizer", "adamw"]
PLAN_TARGET = 120.0  # seconds: issue 13's "a 70B model on up to 1,024 GPUs plans in under 2 minutes"
# Every layout of a 70B model takes longer than 2 minutes to trace (8 GPUs: 192 rank traces, 154 s with two
# workers here on 2026-12-07, 278 and 306 s before ZeRO-3's FSDP twins, kept worlds and cheaper cache keys): these rows run with --time-limit, and the account below each says how many layouts
# were evaluated within it; PLAN_FULL times every layout of 8 GPUs.
PLAN_LIMIT = ["--time-limit", "100"]
PLAN_CASES = [
    Case("plan: Llama-3.1-70B (bundled config), seq 2048, AdamW, on 8 x h100-80gb, --time-limit 100",
         TRAINMEM + ["plan", *LLAMA_70B, "--gpus", "8xh100-80gb", *PLAN_LIMIT, *NO_CACHE], PLAN_TARGET),
    Case("plan: Llama-3.1-70B (bundled config), seq 2048, AdamW, on 1,024 x h100-80gb, --time-limit 100",
         TRAINMEM + ["plan", *LLAMA_70B, "--gpus", "1024xh100-80gb", *PLAN_LIMIT, *NO_CACHE], PLAN_TARGET),
]
# issue 24: every layout of the 70B model evaluated, 8 GPUs, in ≤ 60 s; run without a limit, then asked again with its
# rank traces in the trace cache (a fresh cache directory: the first run stores them)
PLAN_FULL = ("plan: Llama-3.1-70B (bundled config), seq 2048, AdamW, on 8 x h100-80gb, every layout (no time limit)",
             TRAINMEM + ["plan", *LLAMA_70B, "--gpus", "8xh100-80gb", "--format", "json"])
PLAN_FULL_TARGET = 60.0
PLAN_HEADING = "## trainmem plan"


def run_once(command: list[str], cache_dir: str | None = None, stdout: str | None = None) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one fresh process (wait4's rusage: the largest of the process and the
    workers it waited for); its standard output kept in the file `stdout` when given."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if stdout else devnull, 1)
        os.dup2(devnull, 2)
        os.environ["PYTHONPATH"] = str(ROOT / "src")
        if cache_dir is not None:
            os.environ["TRAINMEM_CACHE_DIR"] = cache_dir
        os.execv(command[0], command)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: does not fit, still a finished estimate
        raise SystemExit(f"command failed: {' '.join(command)}")
    return time.perf_counter() - started, usage.ru_maxrss * 1024


def _fake_only_steps(model_ref: str, setup) -> None:
    """The training steps trainmem traces, under FakeTensorMode alone: no recorder, no module tracker,
    an observer that does nothing (trace/run.py trace_training without its bookkeeping)."""
    import torch

    from trainmem.frontends import resolve
    from trainmem.setup import Precision
    from trainmem.trace import step as training
    from trainmem.trace.run import materialize_fake
    from trainmem.trace.torch_private import FakeTensorMode

    source = resolve(model_ref, setup)
    with torch.device("meta"):
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    with FakeTensorMode(allow_non_fake_inputs=True):
        materialize_fake(model, torch.bfloat16 if setup.precision == Precision.BF16 else None)
        prepared = training.prepare(model, make_batch, loss_fn, setup, source)
        training.run_steps(prepared, setup, training.Observer())


def _traced_steps(model_ref: str, setup) -> int:
    """The same steps as trainmem traces them (never from the trace cache, every block traced: a trace composed
    from a few blocks, trace/block_reuse.py, runs fewer ops than it counts); the number of ops the recorder saw."""
    from trainmem.frontends import resolve
    from trainmem.targets import cpu_kernels
    from trainmem.trace.block_reuse import whole_models
    from trainmem.trace.cache_store import switched
    from trainmem.trace.run import trace_training

    with switched(False), whole_models():
        traced = trace_training(resolve(model_ref, setup), setup, cpu_kernels.kernel_ops())
    return sum(traced.op_counts.values())


def per_op_costs(runs: int) -> list[str]:
    """CPU µs per op under FakeTensorMode alone and traced; the recorder's overhead and its share."""
    from trainmem.setup import TrainingSetup

    lines = ["| training steps (2, inline loop) | ops | FakeTensorMode alone µs/op | traced µs/op "
             "| recorder's own µs/op | recorder / FakeTensorMode | target | met |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for label, model_ref, values in PER_OP:
        setup = TrainingSetup.from_mapping(values, where="speed.py")
        ops = _traced_steps(model_ref, setup)  # warms both: imports, meta kernels, FakeTensorMode's cache
        _fake_only_steps(model_ref, setup)
        alone, traced = [], []
        for _ in range(runs):
            started = time.process_time()
            _fake_only_steps(model_ref, setup)
            alone.append(time.process_time() - started)
            started = time.process_time()
            assert _traced_steps(model_ref, setup) == ops
            traced.append(time.process_time() - started)
        fake_cost, traced_cost = statistics.median(alone) / ops, statistics.median(traced) / ops
        share = (traced_cost - fake_cost) / fake_cost
        lines.append(f"| {label} | {ops:,} | {fake_cost * 1e6:.1f} | {traced_cost * 1e6:.1f} | "
                     f"{(traced_cost - fake_cost) * 1e6:.1f} | {share:.0%} | < {RECORDER_TARGET:.0%} | "
                     f"{'yes' if share < RECORDER_TARGET else 'no'} |")
        print(lines[-1], flush=True)
    return lines


def case_row(case: Case, runs: int) -> tuple[str, float]:
    """The table row of `runs` fresh processes of one case (medians, min–max) and the median wall time."""
    results = [run_once(case.command) for _ in range(runs)]
    walls, rss = [r[0] for r in results], [r[1] for r in results]
    wall, peak = statistics.median(walls), statistics.median(rss)
    target = " ".join(filter(None, [f"< {case.wall_target:.0f} s" if case.wall_target else "",
                                    f"< {case.rss_target / 2**30:.0f} GiB" if case.rss_target else ""])) or "—"
    met = "—" if not (case.wall_target or case.rss_target) else (
        "yes" if (not case.wall_target or wall < case.wall_target)
        and (not case.rss_target or peak < case.rss_target) else "no")
    return (f"| {case.name} | {runs} | {wall:.2f} ({min(walls):.2f}–{max(walls):.2f}) | {peak / 2**20:.0f} | "
            f"{target} | {met} |"), wall


# the cases answered from the trace cache (trainmem/trace/cache_store.py): the same commands without --no-cache
CACHED = [SEED_MLP, GPT_ESTIMATE, GRU_ESTIMATE, "Llama-3.1-70B from the bundled config, seq 2048, batch 1, AdamW, "
          "bf16-mixed, on h100-80gb", FIT_GPT]


def cached_section(runs: int, medians: dict[str, float]) -> list[str]:
    """Each CACHED case run once to store its traces in a fresh cache directory, then `runs` times from it."""
    import tempfile

    lines = ["## A question asked again: answered from the trace cache", "",
             "The same commands without `--no-cache`, in a cache directory of their own: one run stores the traces, "
             f"then {runs} fresh processes each are timed (medians, min–max). The figures are the ones the traced "
             "runs give (tests/test_trace_cache.py).", "",
             "| what | runs | wall s | peak RSS MiB | / traced (above) | / import torch |", "|---|---:|---:|---:|---:|---:|"]
    by_name = {case.name: case for case in CASES}
    with tempfile.TemporaryDirectory(prefix="trainmem-speed-cache-") as cache_dir:
        for name in CACHED:
            command = [part for part in by_name[name].command if part not in NO_CACHE]
            run_once(command, cache_dir)
            results = [run_once(command, cache_dir) for _ in range(runs)]
            walls = [r[0] for r in results]
            wall, peak = statistics.median(walls), statistics.median(r[1] for r in results)
            lines.append(f"| {name} | {runs} | {wall:.2f} ({min(walls):.2f}–{max(walls):.2f}) | {peak / 2**20:.0f} | "
                         f"{wall / medians[name]:.2f} | {wall / medians[IMPORT_TORCH]:.2f} |")
            print(lines[-1], flush=True)
    return lines


def plan_section(runs: int, command: str = "") -> list[str]:
    """`trainmem plan` rows: fresh processes, medians of `runs`; the planner's own account of one run (layouts,
    traces) beside them. `command`: the speed.py command line that made them, when not `--only plan`."""
    import json
    import subprocess

    command = command or f"python benchmarks/speed.py --only plan --plan-runs {runs}"
    lines = [PLAN_HEADING, "", f"Generated {datetime.date.today()} by `{command}` on {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at the start); "
             "medians (min–max) of fresh processes; `--jobs` left at its default (one worker per CPU, as memory "
             "allows). How traces are reused: trainmem/plan/reuse.py; which layouts need no trace: "
             "trainmem/plan/states.py and offload_order.py.", "",
             "| what | runs | wall s | peak RSS MiB | target | met |", "|---|---:|---:|---:|---|---|"]
    accounts = []
    for case in PLAN_CASES:
        row, _ = case_row(case, runs)
        done = subprocess.run(case.command + ["--format", "json"], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        data = json.loads(done.stdout) if done.stdout.strip() else None
        waiting = data["counts"].get("not evaluated", 0) if data else None
        if waiting:  # under the limit, but not a plan of every layout: the target is not met
            row = row.replace("| yes |", f"| no: {waiting:,} layouts not evaluated |")
        lines.append(row)
        print(row, flush=True)
        if data:
            accounts.append(plan_account(case.name, data))
    full, full_accounts = full_plan_rows()
    return lines + full + ["", "One more run of each, as JSON, says what was done (the last two: those runs themselves):",
                           ""] + accounts + full_accounts


def plan_account(name: str, data: dict) -> str:
    counts = ", ".join(f"{n:,} {k}" for k, n in sorted(data["counts"].items()))
    cached = data.get("cached_traces", 0)
    return (f"- {name}: {sum(data['counts'].values()):,} layouts ({counts}); {data['traces']:,} rank traces"
            + (f" ({cached:,} from the trace cache)" if cached else "") + f", {data['predicted_traces']:,} predicted; "
            f"{len(data['fits']):,} fit" + (f", best {data['fits'][0]['label']}" if data["fits"] else ""))


def full_plan_rows() -> tuple[list[str], list[str]]:
    """PLAN_FULL once into an empty trace cache and once more from it: (table rows, accounts)."""
    import json
    import tempfile

    name, command = PLAN_FULL
    rows, accounts = [], []
    with tempfile.TemporaryDirectory(prefix="trainmem-speed-plan-") as cache_dir:
        for words in ("traced", "asked again, its rank traces from the trace cache"):
            out = os.path.join(cache_dir, "plan.json")
            wall, peak = run_once(command, cache_dir, stdout=out)
            with open(out) as answer:
                data = json.load(answer)
            waiting = data["counts"].get("not evaluated", 0)
            met = "yes" if wall < PLAN_FULL_TARGET and not waiting else "no"
            rows.append(f"| {name}, {words} | 1 | {wall:.2f} | {peak / 2**20:.0f} | < {PLAN_FULL_TARGET:.0f} s | {met} |")
            accounts.append(plan_account(f"{name}, {words}", data))
            print(rows[-1], flush=True)
    return rows, accounts


def merge_plan_section(section: list[str]) -> None:
    """Replace (or append) the plan section of speed.md, keeping every other line."""
    path = ROOT / "benchmarks/results/speed.md"
    text = path.read_text() if path.exists() else "# Speed of an estimate\n"
    before, _, after = text.partition(PLAN_HEADING)
    rest = after.split("\n## ", 1)[1] if "\n## " in after else ""
    merged = before.rstrip("\n") + "\n\n" + "\n".join(section) + "\n" + (f"\n## {rest}" if rest else "")
    path.write_text(merged)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per short case, and per-op repeats")
    parser.add_argument("--long-runs", type=int, default=3, help="fresh processes per long case")
    parser.add_argument("--plan-runs", type=int, default=3, help="fresh processes per plan case")
    parser.add_argument("--only", choices=["plan", "estimates"],
                        help="plan: run only the plan section and merge it into speed.md; estimates: everything but "
                             "the plan section, which stays as it was")
    args = parser.parse_args()
    if args.only == "plan":
        merge_plan_section(plan_section(args.plan_runs))
        return
    path = ROOT / "benchmarks/results/speed.md"
    kept_plan = PLAN_HEADING + path.read_text().partition(PLAN_HEADING)[2] if path.exists() else ""
    started, load_at_start = time.perf_counter(), os.getloadavg()[0]
    lines = ["# Speed of an estimate", "",
             f"Generated {datetime.date.today()} by `python benchmarks/speed.py --runs {args.runs} --long-runs "
             f"{args.long_runs}{' --only estimates' if args.only else ''}` on "
             f"{os.cpu_count()} cores; medians (min–max) of fresh processes (the run count is in each row).", "",
             "| what | runs | wall s | peak RSS MiB | target | met |", "|---|---:|---:|---:|---|---|"]
    medians: dict[str, float] = {}
    for case in CASES:
        row, medians[case.name] = case_row(case, args.long_runs if case.long else args.runs)
        lines.append(row)
        print(lines[-1], flush=True)
    lines += ["", "| ratio of medians | this run | target | met |", "|---|---:|---:|---|"]
    for case, base, most in RATIO_TARGETS:
        ratio = medians[case] / medians[base]
        lines.append(f"| {case} / {base} | {ratio:.2f} | ≤ {most} | {'yes' if ratio <= most else 'no'} |")
    fit_ratio = medians[FIT_GPT] / medians[ONE_GPT]
    lines += ["", f"`trainmem fit` on the 1.3B model takes {fit_ratio:.1f} × one estimate of the same setup.", "",
              "## The recorder's cost per op", "",
              "CPU time of the same two training steps in one process, alternately under FakeTensorMode alone and "
              f"as trainmem traces them; medians of {args.runs} of each, divided by the ops the recorder saw "
              "(every dispatch, `prim.device` queries included). Traced runs trainmem's own FakeTensorMode, whose "
              "dispatch-cache keys cost less than FakeTensorMode's (trainmem/trace/fake_cache.py): what they save "
              "is subtracted from the recorder's own cost here.", ""]
    lines += per_op_costs(args.runs)
    lines += [""] + cached_section(args.runs, medians)
    lines += ["", f"The whole run took {(time.perf_counter() - started) / 60:.0f} minutes; the load average (1 min) "
              f"was {load_at_start:.1f} at its start and {os.getloadavg()[0]:.1f} at its end, on {os.cpu_count()} cores."]
    if args.only == "estimates" and kept_plan:
        lines += ["", kept_plan.rstrip("\n")]
    else:
        lines += [""] + plan_section(args.plan_runs, f"python benchmarks/speed.py --runs {args.runs} --long-runs "
                                     f"{args.long_runs} --plan-runs {args.plan_runs}")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
