"""trainmem under every supported torch release that matters (the Makefile's COMPAT_VERSIONS), next to the dev
pin (2.13.0): `make compat`.

The estimate traces the user's own torch (its autocast lists, attention and optimizer code, its private
distributed APIs), so a different torch can give a different answer for the same setup, or none: this says
which, and by how much.

    python benchmarks/compat.py run [--no-tests] --out FILE     # in one environment: tests + estimates → JSON
    python benchmarks/compat.py features --out FILE             # in one environment: every feature's CLI → JSON
    python benchmarks/compat.py report --baseline FILE [--features FILE...] FILE...
                                                                 # → benchmarks/results/compat.md

`features` runs one real command line per feature (FEATURES below), each in a fresh process with a timeout,
and records its exit code, its stderr's first line and its wall time. A feature passes with its expected exit
code (0, or 1 where the case is meant not to fit); a torch that cannot do a feature may refuse it, and that
counts only as one line on stderr with exit 2 that names the torch it needs ("--strategy fsdp needs torch >=
2.7 (…)"). Anything else fails: a traceback, an error's exit 1, an exit 2 that names no torch, a timeout.

`run` records, in the environment whose python runs it:
- the core tests: `pytest -m "not slow"` without tests/test_vision.py. `slow` tests run the models for real in
  fresh processes (minutes each, and they measure this machine rather than the trace); test_vision needs
  torchvision and timm, whose wheels pair with one torch release each. Tests whose optional package
  (peft, onnx) is not installed skip themselves and are counted as skipped, with their reason.
- the calibration estimates: the seed MLP on the CPU and on a GPU of the catalog, and the BERT rows of
  benchmarks/data/gpu_published.jsonl (BERT-base masked LM, the GPU calibration point; BERT-large in fp32,
  fp16 autocast and with checkpointing), each with its numbers, its breakdown at the peak and its wall time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "compat.md"
PUBLISHED = ROOT / "benchmarks" / "data" / "gpu_published.jsonl"
MB = 10**6

# the core tests (module docstring); the tests' own markers and importorskips do the rest
CORE_TESTS = ["-m", "not slow", "--ignore=tests/test_vision.py"]
# a whole core-test run takes ~8 min here (2 cores); an environment that hangs is reported, not waited on
TEST_TIMEOUT_SECONDS = 3600
SEED = {"model": "mlp:1000-100-100-100-100-10",
        "setup": {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}}
GPU = "a100-40gb"  # the catalog GPU of the BERT calibration point (benchmarks/speed.py)
# rows of gpu_published.jsonl: BERT-base (the calibration point), BERT-large fp32, fp16-mixed (autocast:
# what runs in half precision is this torch's list) and checkpointed with gradient accumulation
BERT_ROWS = ("ob-rocm-bert-base-mlm", "hf-doc-bert-large-b4", "hf-doc-bert-large-b4-fp16",
             "hf-doc-bert-large-b1-ga4-gc")
OPS_SHOWN = 12  # op-count differences listed per estimate, largest first: enough to see what code changed
COUNTERS = ("tensor_bytes", "allocated_bytes", "reserved_bytes", "process_bytes", "process_bytes_high")


def calibration_cases() -> list[dict]:
    """(id, model, setup, device, estimate options, measured) of each calibration estimate."""
    cases = [{"id": "seed-mlp-cpu", **SEED, "device": "cpu", "options": {}, "measured": {}},
             {"id": f"seed-mlp-{GPU}", **SEED, "device": GPU, "options": {}, "measured": {}}]
    rows = {row["id"]: row for row in map(json.loads, PUBLISHED.read_text().splitlines()) if row}
    for row_id in BERT_ROWS:
        row = rows[row_id]
        model = str(ROOT / row["model"]) if row["model"].startswith(("benchmarks/", "tests/")) else row["model"]
        options = {key: row[key] for key in ("cuda_context", "cuda_version", "module_loading") if key in row}
        cases.append({"id": row_id, "model": model, "setup": row["setup"], "device": row["device"],
                      "options": options, "measured": row["measured"]})
    return cases


def run_estimates() -> list[dict]:
    sys.path.insert(0, str(ROOT / "src"))
    from trainmem import estimate
    from trainmem.setup import TrainingSetup

    results = []
    for case in calibration_cases():
        started = time.perf_counter()
        try:
            est = estimate(case["model"], setup=TrainingSetup.from_mapping(case["setup"], where=case["id"]),
                           device=case["device"], **case["options"])
        except Exception as error:  # noqa: BLE001 - a failure under this torch is the finding to report
            results.append({"id": case["id"], "error": f"{type(error).__name__}: {str(error).splitlines()[0]}",
                            "seconds": time.perf_counter() - started})
            continue
        results.append({"id": case["id"], "seconds": time.perf_counter() - started,
                        "measured": case["measured"],
                        **{counter: getattr(est, counter) for counter in COUNTERS},
                        "breakdown": dict(est.breakdown), "peak": f"{est.peak_phase}, {est.peak_op}",
                        "resolved": {key: str(value) for key, value in est.resolved.items()},
                        "ops": dict(est.coverage.get("ops", {})),
                        "cuda": (est.coverage.get("cuda_runtime") or {}).get("cuda_version"),
                        "borrowed": [w for w in est.warnings if "no measurement for torch" in w]})
    return results


def run_tests(junit: Path) -> dict:
    started = time.perf_counter()
    command = [sys.executable, "-m", "pytest", *CORE_TESTS, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TEST_TIMEOUT_SECONDS)
    seconds = time.perf_counter() - started
    if not junit.exists():
        return {"command": " ".join(command[1:]), "seconds": seconds, "error": done.stdout[-2000:] + done.stderr[-2000:]}
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures, skips = [], {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}".replace("tests/", "tests/", 1)
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            counts["failed"] += 1
            failures.append({"test": name, "message": (problem.get("message") or "").splitlines()[0][:300]
                             if problem.get("message") else ""})
        elif skipped is not None:
            counts["skipped"] += 1
            reason = (skipped.get("message") or "").splitlines()[0][:200] if skipped.get("message") else ""
            skips[reason] = skips.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return {"command": "python " + " ".join(command[1:-1]), "seconds": seconds, **counts,
            "failures": failures, "skips": skips, "exit_code": done.returncode}


def checkout() -> str:
    """The commit the tests and the estimates ran from, and whether tracked files differed from it."""
    def git(*arguments: str) -> str:
        return subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    try:
        commit, changes = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown (no git)"
    return (commit or "unknown") + (" with uncommitted changes" if changes else "")


def environment() -> dict:
    import torch

    versions = {}
    for package in ("transformers", "pytest"):
        try:
            from importlib.metadata import version
            versions[package] = version(package)
        except Exception:  # noqa: BLE001 - not installed
            versions[package] = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "packages": versions, "prefix": sys.prefix, "date": datetime.date.today().isoformat(),
            "checkout": checkout()}


def command_run(args) -> None:
    started = time.perf_counter()
    record = {"environment": environment()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    estimates_started = time.perf_counter()
    record["estimates"] = run_estimates()
    record["estimates_seconds"] = time.perf_counter() - estimates_started
    if not args.no_tests:
        record["tests"] = run_tests(out.with_suffix(".junit.xml"))
    record["seconds"] = time.perf_counter() - started
    out.write_text(json.dumps(record, indent=1))
    print(f"{record['environment']['torch']}: {out}")


# ---------------------------------------------------------------- features
@dataclass(frozen=True)
class Feature:
    """One feature's command line (after `trainmem`), and the exit codes that mean it worked."""

    id: str
    label: str
    argv: tuple[str, ...]
    ok: tuple[int, ...] = (0,)
    env: dict = field(default_factory=dict)


FEATURE_TIMEOUT_SECONDS = 600  # the slowest here (fit on the CPU, plan) take under a minute on 2 cores
MLP = ("mlp:1000-100-10", "--input-shape", "1000", "--batch-size", "32")
GPT = ("tests/models.py:tiny_gpt", "--batch-size", "2")
LLAMA = ("hf:tests/data/tiny_llama", "--batch-size", "2", "--seq-len", "64")
PARALLEL = ("mlp:256-512-512-10", "--batch-size", "8", "--device", "a100-80gb")
SMALL = ("mlp:64-32-10", "--batch-size", "8")
FEATURES = (
    Feature("estimate-cpu-mlp", "estimate, CPU (mlp:)", ("estimate", *MLP, "--quiet")),
    Feature("estimate-cpu-file", "estimate, CPU (tests/models.py:tiny_gpt)", ("estimate", *GPT, "--quiet")),
    Feature("estimate-gpu", "estimate, GPU (--device a100-40gb)", ("estimate", *GPT, "--device", "a100-40gb", "--quiet")),
    Feature("estimate-oom", "estimate that does not fit (exit 1)",
            ("estimate", *LLAMA, "--device", "custom:capacity=30MiB,cc=8.0", "--quiet"), ok=(1,)),
    Feature("bf16-mixed", "--precision bf16-mixed", ("estimate", *GPT, "--precision", "bf16-mixed", "--device",
                                                      "a100-40gb", "--quiet")),
    Feature("checkpointing", "--checkpointing", ("estimate", *GPT, "--checkpointing", "--quiet")),
    Feature("fit-cpu", "fit, CPU", ("fit", *MLP[:3], "--device", "cpu")),
    Feature("fit-gpu", "fit, GPU", ("fit", *MLP[:3], "--device", "a100-40gb")),
    Feature("fit-max-seq", "fit --max-seq (hf:)", ("fit", *LLAMA[:3], "--max-seq", "--device", "a100-40gb")),
    Feature("sweep", "compare --sweep batch=2,4", ("compare", *MLP[:3], "--sweep", "batch=2,4")),
    Feature("compare", "compare A B", ("compare", "mlp:1000-100-10", "mlp:1000-200-10", "--input-shape", "1000")),
    *(Feature(f"strategy-{kind}", f"--strategy {kind} --world-size 2",
              ("estimate", *PARALLEL, "--strategy", kind, "--world-size", "2", "--quiet"))
      for kind in ("ddp", "fsdp", "zero1", "zero2", "zero3")),
    Feature("strategy-hsdp", "--strategy hsdp --world-size 4 --dp-shard 2",
            ("estimate", *PARALLEL, "--strategy", "hsdp", "--world-size", "4", "--dp-shard", "2", "--quiet")),
    Feature("tp", "--tp 2", ("estimate", *PARALLEL, "--tp", "2", "--quiet")),
    Feature("pp", "--pp 2", ("estimate", *PARALLEL, "--pp", "2", "--quiet")),
    Feature("pp-bf16", "--pp 2 --precision bf16-mixed", ("estimate", *PARALLEL, "--pp", "2", "--precision",
                                                         "bf16-mixed", "--quiet")),
    Feature("fsdp-tp-bf16", "--strategy fsdp --dp 2 --tp 2 --precision bf16-mixed",
            ("estimate", *PARALLEL, "--strategy", "fsdp", "--dp", "2", "--tp", "2", "--precision", "bf16-mixed",
             "--quiet")),
    Feature("fit-ddp", "fit --strategy ddp --world-size 2", ("fit", PARALLEL[0], "--device", "a100-80gb",
                                                             "--strategy", "ddp", "--world-size", "2")),
    Feature("plan", "plan --gpus 2xh100-80gb", ("plan", "mlp:256-512-512-10", "--gpus", "2xh100-80gb")),
    Feature("hf", "hf:tests/data/tiny_llama", ("estimate", *LLAMA, "--quiet")),
    Feature("lora", "--lora r=4,targets=q_proj", ("estimate", *LLAMA, "--lora", "r=4,targets=q_proj", "--quiet")),
    Feature("qlora", "--qlora (a100-40gb)", ("estimate", *LLAMA, "--qlora", "--device", "a100-40gb", "--quiet")),
    Feature("hf-fsdp", "hf: --strategy fsdp --world-size 2", ("estimate", *LLAMA, "--device", "a100-80gb",
                                                              "--strategy", "fsdp", "--world-size", "2", "--quiet")),
    Feature("hf-tp-pp", "hf: --tp 2 --pp 2 --precision bf16-mixed",
            ("estimate", *LLAMA, "--device", "a100-80gb", "--tp", "2", "--pp", "2", "--precision", "bf16-mixed",
             "--quiet")),
    Feature("keras-torch", "Keras, torch backend", ("estimate", *SMALL, "--framework", "keras", "--keras-backend",
                                                    "torch", "--quiet")),
    Feature("measure-cpu", "measure, CPU (--runs 1)", ("measure", *SMALL, "--runs", "1")),
    Feature("measure-ddp", "measure --strategy ddp --world-size 2 (gloo)",
            ("measure", *SMALL, "--strategy", "ddp", "--world-size", "2", "--runs", "1")),
)
# the one refusal that counts: "… needs torch >= 2.7 (this is torch 2.6.0: …)"
TORCH_REQUIREMENT = re.compile(r"needs torch\s*(>=|≥)\s*\d+\.\d+")
# a library's Python warning on stderr ("file.py:12: FutureWarning: …" and its indented source line) is noise
# around the answer, not a second line of it
PYTHON_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")


def _stderr_lines(stderr: str) -> list[str]:
    lines, in_warning = [], False
    for line in stderr.splitlines():
        if PYTHON_WARNING.match(line):
            in_warning = True
            continue
        if in_warning and line.startswith((" ", "\t")):
            continue
        in_warning = False
        if line.strip():
            lines.append(line.rstrip())
    return lines


def feature_verdict(feature: Feature, code: int | None, stderr: str) -> tuple[str, str]:
    """(pass | refused | FAIL, the reason shown): see the module docstring for what counts."""
    lines = _stderr_lines(stderr)
    first = lines[0] if lines else ""
    traceback = any(line.startswith("Traceback (most recent call last)") for line in lines)
    # a traceback's first line says nothing: its last line names the exception
    reason = (lines[-1] if traceback else first)[:300]
    if code is None:
        return "FAIL", f"no answer in {FEATURE_TIMEOUT_SECONDS} s"
    if code in feature.ok and not traceback:
        return "pass", ""
    if code == 2 and len(lines) == 1 and TORCH_REQUIREMENT.search(first):
        return "refused", first.removeprefix("trainmem: error: ")
    return "FAIL", f"exit {code}: {reason or '(nothing on stderr)'}"


def run_feature(feature: Feature) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **feature.env}
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "trainmem", *feature.argv], cwd=ROOT, capture_output=True,
                              text=True, env=env, timeout=FEATURE_TIMEOUT_SECONDS)
        code, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as expired:
        code = None
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else (expired.stderr or "")
    seconds = time.perf_counter() - started
    verdict, reason = feature_verdict(feature, code, stderr)
    lines = _stderr_lines(stderr)
    return {"id": feature.id, "command": "trainmem " + " ".join(feature.argv), "exit_code": code,
            "verdict": verdict, "reason": reason, "stderr_first_line": lines[0][:300] if lines else "",
            "seconds": seconds}


def command_features(args) -> None:
    chosen = [f for f in FEATURES if not args.only or f.id in args.only]
    record = {"environment": environment(), "features": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for feature in chosen:
        result = run_feature(feature)
        record["features"].append(result)
        print(f"{record['environment']['torch']:>12}  {feature.id:<18} {result['verdict']:<8} "
              f"{result['seconds']:6.1f} s  {result['reason']}", flush=True)
        out.write_text(json.dumps(record, indent=1))  # what ran so far survives an interrupted run


# ---------------------------------------------------------------- report
def _mb(value) -> str:
    return "—" if value is None else f"{value / MB:,.1f}"


def _difference(value, base) -> str:
    if value is None or base is None:
        return "—"
    if value == base:
        return "="
    return f"{(value - base) / MB:+,.1f} MB ({value / base - 1:+.2%})" if base else f"{(value - base) / MB:+,.1f} MB"


def _estimate_tables(baseline: dict, others: list[dict]) -> list[str]:
    base = {row["id"]: row for row in baseline["estimates"]}
    lines = []
    for case_id in [row["id"] for row in baseline["estimates"]]:
        rows = [(baseline["environment"]["torch"], base[case_id])] + [
            (other["environment"]["torch"], next(r for r in other["estimates"] if r["id"] == case_id)) for other in others]
        measured = base[case_id].get("measured") or {}
        lines += [f"### {case_id}", ""]
        if measured:
            lines += ["measured (the row's published figure): " + ", ".join(
                f"{key.replace('_bytes', '')} {value / MB:,.1f} MB" for key, value in measured.items()), ""]
        header = "| counter (MB) | " + " | ".join(f"torch {torch}" for torch, _ in rows) + " |"
        lines += [header, "|" + "---|" * (len(rows) + 1)]
        for counter in COUNTERS:
            cells = []
            for index, (_torch, row) in enumerate(rows):
                if "error" in row:
                    cells.append("failed")
                elif index == 0:
                    cells.append(_mb(row[counter]))
                else:
                    cells.append(f"{_mb(row[counter])} ({_difference(row[counter], base[case_id].get(counter))})")
            lines.append(f"| {counter.replace('_bytes', '')} | " + " | ".join(cells) + " |")
        lines.append("| wall time | " + " | ".join(f"{row['seconds']:.1f} s" for _torch, row in rows) + " |")
        lines.append("")
        for torch_version, row in rows[1:]:
            if "error" in row:
                lines.append(f"- torch {torch_version}: the estimate failed: {row['error']}")
                continue
            if "error" in base[case_id]:
                continue
            changed = {key: row["breakdown"].get(key, 0) - base[case_id]["breakdown"].get(key, 0)
                       for key in sorted(set(row["breakdown"]) | set(base[case_id]["breakdown"]))}
            changed = {key: value for key, value in changed.items() if value}
            if changed:
                lines.append(f"- torch {torch_version}, breakdown at the peak vs {rows[0][0]}: " + ", ".join(
                    f"{key} {value / MB:+,.2f} MB" for key, value in changed.items()))
            if row["peak"] != base[case_id]["peak"]:
                lines.append(f"- torch {torch_version}: peak at {row['peak']} (vs {base[case_id]['peak']})")
            resolved = {key: value for key, value in row["resolved"].items()
                        if base[case_id]["resolved"].get(key) != value}
            if resolved:
                lines.append(f"- torch {torch_version}: resolved differently: " + ", ".join(
                    f"{key} = {value} (vs {base[case_id]['resolved'].get(key)})" for key, value in resolved.items()))
            if row.get("cuda") != base[case_id].get("cuda"):
                lines.append(f"- torch {torch_version}: CUDA {row.get('cuda')} assumed for the target "
                             f"(vs {base[case_id].get('cuda')})")
            ops = {op: row.get("ops", {}).get(op, 0) - base[case_id].get("ops", {}).get(op, 0)
                   for op in sorted(set(row.get("ops", {})) | set(base[case_id].get("ops", {})))}
            ops = {op: count for op, count in ops.items() if count}
            if ops:
                lines.append(f"- torch {torch_version}, ops traced vs {rows[0][0]} (calls): " + ", ".join(
                    f"{op} {count:+d}" for op, count in sorted(ops.items(), key=lambda item: -abs(item[1]))[:OPS_SHOWN])
                    + (f", and {len(ops) - OPS_SHOWN} more ops" if len(ops) > OPS_SHOWN else ""))
            for warning in row["borrowed"]:
                lines.append(f"- torch {torch_version}: {warning}")
        lines.append("")
    return lines


def _identical(baseline: dict, record: dict) -> str:
    base = {row["id"]: row for row in baseline["estimates"]}
    same = [row["id"] for row in record["estimates"] if "error" not in row and "error" not in base[row["id"]]
            and all(row[counter] == base[row["id"]][counter] for counter in COUNTERS)]
    return f"{len(same)} of {len(record['estimates'])}"


def _version_key(torch_version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", torch_version.split("+")[0])[:3])


def _feature_cell(result: dict | None) -> str:
    if result is None:
        return "not run"
    if result["verdict"] == "pass":
        return f"pass ({result['seconds']:.0f} s)"
    if result["verdict"] == "refused":
        return "refused: " + result["reason"].split(" (this is torch")[0].replace("|", "\\|")
    return "**FAIL**: " + result["reason"][:140].replace("|", "\\|")


def _feature_matrix(feature_records: list[dict], test_records: dict[str, dict]) -> list[str]:
    """Features × torch: what each CLI feature did under each torch, and the core tests' counts."""
    records = sorted(feature_records, key=lambda record: _version_key(record["environment"]["torch"]))
    versions = [record["environment"]["torch"] for record in records]
    by_torch = {record["environment"]["torch"]: {row["id"]: row for row in record["features"]} for record in records}
    lines = ["## Every feature on every torch", "",
             "`benchmarks/compat.py features`: one command line per feature, each in a fresh process (its command "
             "and the rules below the table). pass: the expected exit code (0; 1 for the case that does not fit) "
             "without a traceback; refused: one line on stderr, exit 2, naming the torch the feature needs; "
             "**FAIL**: anything else, with the first line of stderr (a traceback's last).", "",
             "| feature | " + " | ".join(f"torch {version}" for version in versions) + " |",
             "|" + "---|" * (len(versions) + 1)]
    for feature in FEATURES:
        lines.append(f"| {feature.label} | " + " | ".join(
            _feature_cell(by_torch[version].get(feature.id)) for version in versions) + " |")
    cells = []
    for version in versions:
        tests = (test_records.get(version) or {}).get("tests")
        cells.append(f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
                     if tests and "passed" in tests else "not run here")
    lines.append("| core tests (`pytest -m \"not slow\"`) | " + " | ".join(cells) + " |")
    lines += ["", "Commands (from the repository root, `trainmem` = `python -m trainmem` of that environment):", ""]
    lines += [f"- {feature.label}: `trainmem {' '.join(feature.argv)}`" for feature in FEATURES]
    for verdict, title in (("refused", "Refusals"), ("FAIL", "Failures")):
        rows = [(version, row) for version in versions for row in by_torch[version].values()
                if row["verdict"] == verdict]
        if rows:
            lines += ["", f"{title} in full (stderr):", ""]
            lines += [f"- torch {version}, {row['id']}: {row['reason']}" for version, row in rows]
    return lines + [""]


def command_report(args) -> None:
    baseline = json.loads(Path(args.baseline).read_text())
    others = [json.loads(Path(path).read_text()) for path in args.results]
    features = [json.loads(Path(path).read_text()) for path in args.features or ()]
    lines = ["# trainmem under every supported torch", "",
             f"Written by `make compat` (benchmarks/compat.py) on {others[0]['environment']['date'] if others else ''}, "
             f"{platform.machine()}, Python {baseline['environment']['python']}, from commit "
             f"{(others[0] if others else baseline)['environment']['checkout']}. Each torch runs in its own "
             "environment (.venv-compat-<version>): that torch first, then trainmem with its dependencies resolved "
             "against it (`pip install -e .`, which keeps the torch); the baseline is the dev environment .venv (torch "
             f"{baseline['environment']['torch']}, the pin of the Makefile). Every torch here but the baseline is "
             "a CUDA build, run on this machine's CPU.", ""]
    if features:
        lines += _feature_matrix(features, {record["environment"]["torch"]: record for record in [baseline] + others})
    lines += ["## Environments and core tests", "",
             f"Core tests: `{others[0]['tests']['command'] if others and 'tests' in others[0] else ''}` "
             "(benchmarks/compat.py says why this subset).", "",
             "| torch | CUDA | transformers | passed | failed | skipped | tests' wall time | estimates' wall time "
             "| estimates identical to the baseline's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for record in [baseline] + others:
        env, tests = record["environment"], record.get("tests")
        counts = (f"{tests['passed']} | {tests['failed']} | {tests['skipped']} | {tests['seconds']:.0f} s"
                  if tests and "passed" in tests else "— | — | — | —")
        lines.append(f"| {env['torch']} | {env['cuda'] or '—'} | {env['packages'].get('transformers') or '—'} | "
                     f"{counts} | {record['estimates_seconds']:.0f} s | {_identical(baseline, record)} |")
    lines += ["", "The baseline's tests are not run here: `make test` runs all of them in .venv. An estimate is "
              "identical when every counter below is.", ""]
    for record in others:
        tests = record.get("tests") or {}
        if tests.get("error"):
            lines += [f"torch {record['environment']['torch']}: the tests did not report: {tests['error']}", ""]
        if tests.get("failures"):
            lines += [f"Failed under torch {record['environment']['torch']}:", ""]
            lines += [f"- `{failure['test']}`: {failure['message']}" for failure in tests["failures"]] + [""]
        if tests.get("skips"):
            lines += [f"Skipped under torch {record['environment']['torch']}:", ""]
            lines += [f"- {count} × {reason or '(no reason given)'}" for reason, count in sorted(tests["skips"].items())]
            lines.append("")
    lines += ["## Calibration estimates", "",
              f"Each cell: the estimate under that torch, and its difference from torch "
              f"{baseline['environment']['torch']} (= identical). `process` on the CPU is the peak RSS, on a GPU "
              "what nvidia-smi shows. Below each table: what differs in the breakdown at the peak, where the peak "
              "is, the settings the trace resolved (attention backend, optimizer implementation), and the facts "
              "borrowed from another torch build.", ""]
    lines += _estimate_tables(baseline, others)
    RESULTS.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    failed = [f"torch {record['environment']['torch']}, {row['id']}: {row['reason']}"
              for record in features for row in record["features"] if row["verdict"] == "FAIL"]
    if failed:  # the report is written either way; `make compat` fails on a feature that failed
        sys.exit("features that failed:\n  " + "\n  ".join(failed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="tests and estimates in this environment, to a JSON file")
    run.add_argument("--out", required=True)
    run.add_argument("--no-tests", action="store_true", help="estimates only (the baseline)")
    features = commands.add_parser("features", help="every feature's command line in this environment, to JSON")
    features.add_argument("--out", required=True)
    features.add_argument("--only", nargs="+", metavar="ID", help="these features only: "
                          + ", ".join(feature.id for feature in FEATURES))
    report = commands.add_parser("report", help="write benchmarks/results/compat.md")
    report.add_argument("--baseline", required=True)
    report.add_argument("--features", nargs="+", metavar="FILE", help="`features` output of each environment")
    report.add_argument("results", nargs="+")
    args = parser.parse_args()
    {"run": command_run, "features": command_features, "report": command_report}[args.command](args)


if __name__ == "__main__":
    main()
