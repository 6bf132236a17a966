"""The feature matrix of `make compat` (benchmarks/compat.py features): one real command line per feature, each in a
fresh process with a timeout, and what counts as a pass, a refusal and a failure.

A feature passes with its expected exit code (0, or 1 where the case is meant not to fit) and no traceback; a
torch that cannot do a feature may refuse it, and that counts only as one line on stderr with exit 2 that names
the torch it needs ("--strategy fsdp needs torch >= 2.7 (…)"). Anything else fails: a traceback, an error's
exit 1, an exit 2 that names no torch, a timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    Feature("estimate-gpu", "estimate, GPU (--device a100-40gb)",
            ("estimate", *GPT, "--device", "a100-40gb", "--quiet")),
    Feature("estimate-oom", "estimate that does not fit (exit 1)",
            ("estimate", *LLAMA, "--device", "custom:capacity=30MiB,cc=8.0", "--quiet"), ok=(1,)),
    Feature("bf16-mixed", "--precision bf16-mixed", ("estimate", *GPT, "--precision", "bf16-mixed", "--device",
                                                      "a100-40gb", "--quiet")),
    Feature("checkpointing", "--checkpointing", ("estimate", *GPT, "--checkpointing", "--quiet")),
    Feature("compile", "--compile, CPU (Inductor's plan)",
            ("estimate", "tests/models.py:cnn_bn", "--batch-size", "4", "--compile", "--no-cache", "--quiet")),
    Feature("fit-cpu", "fit, CPU", ("fit", *MLP[:3], "--device", "cpu")),
    Feature("fit-gpu", "fit, GPU", ("fit", *MLP[:3], "--device", "a100-40gb")),
    Feature("fit-max-seq", "fit --max-seq (hf:)", ("fit", *LLAMA[:3], "--max-seq", "--device", "a100-40gb")),
    Feature("sweep", "compare --sweep batch=2,4", ("compare", *MLP[:3], "--sweep", "batch=2,4")),
    Feature("compare", "compare A B", ("compare", "mlp:1000-100-10", "mlp:1000-200-10", "--input-shape", "1000")),
    *(Feature(f"strategy-{kind}", f"--strategy {kind} --world-size 2",
              ("estimate", *PARALLEL, "--strategy", kind, "--world-size", "2", "--quiet"))
      for kind in ("ddp", "fsdp", "fsdp1", "zero1", "zero2", "zero3")),
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
    Feature("hf-fsdp-pp", "hf: --strategy fsdp --dp 2 --pp 2 --precision bf16-mixed",
            ("estimate", *LLAMA, "--device", "a100-80gb", "--strategy", "fsdp", "--dp", "2", "--pp", "2", "--precision",
             "bf16-mixed", "--quiet")),
    Feature("hf-tp-pp", "hf: --tp 2 --pp 2 --precision bf16-mixed",
            ("estimate", *LLAMA, "--device", "a100-80gb", "--tp", "2", "--pp", "2", "--precision", "bf16-mixed",
             "--quiet")),
    Feature("keras-torch", "Keras, torch backend", ("estimate", *SMALL, "--framework", "keras", "--keras-backend",
                                                    "torch", "--quiet")),
    Feature("measure-cpu", "measure, CPU (--runs 1)", ("measure", *SMALL, "--runs", "1")),
    Feature("measure-ddp", "measure --strategy ddp --world-size 2 (gloo)",
            ("measure", *SMALL, "--strategy", "ddp", "--world-size", "2", "--runs", "1")),
    Feature("measure-fsdp1", "measure --strategy fsdp1 --world-size 2 (gloo)",
            ("measure", *SMALL, "--strategy", "fsdp1", "--world-size", "2", "--runs", "1")),
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
        stderr = expired.stderr or ""
        stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    seconds = time.perf_counter() - started
    verdict, reason = feature_verdict(feature, code, stderr)
    lines = _stderr_lines(stderr)
    return {"id": feature.id, "command": "trainmem " + " ".join(feature.argv), "exit_code": code,
            "verdict": verdict, "reason": reason, "stderr_first_line": lines[0][:300] if lines else "",
            "seconds": seconds}


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


def feature_matrix(feature_records: list[dict], test_records: dict[str, dict]) -> list[str]:
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
