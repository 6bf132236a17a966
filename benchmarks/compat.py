"""trainmem under every supported torch release that matters (the Makefile's COMPAT_VERSIONS), next to the dev
pin (2.13.0): `make compat`.

The estimate traces the user's own torch (its autocast lists, attention and optimizer code, its private
distributed APIs), so a different torch can give a different answer for the same setup, or none: this says
which, and by how much.

    python benchmarks/compat.py run [--no-tests] --out FILE     # in one environment: tests + estimates → JSON
    python benchmarks/compat.py features --out FILE             # in one environment: every feature's CLI → JSON
    python benchmarks/compat.py report --baseline FILE [--features FILE...] FILE...
                                                                 # → benchmarks/results/compat.md

`features` runs one real command line per feature (benchmarks/compat_features.py: the list, and what counts as
a pass, a refusal and a failure) and records each one's exit code, stderr's first line and wall time.

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
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compat_features import FEATURES, feature_matrix, run_feature  # noqa: E402 - however this file is loaded

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
                           device=case["device"], target_options=case["options"])
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
    commits = {record["environment"]["checkout"] for record in features} - {(others[0] if others else baseline)
                                                                           ["environment"]["checkout"]}
    if commits:  # the feature matrix was rerun after a later change than the core tests
        lines += [f"The feature matrix below ran from commit {', '.join(sorted(commits))}.", ""]
    if features:
        lines += feature_matrix(features, {record["environment"]["torch"]: record for record in [baseline] + others})
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
