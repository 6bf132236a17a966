"""benchmarks/compat_features.py, the feature matrix of `make compat`: what counts as a pass, a refusal and a
failure of one feature's command line under one torch, and that `make compat` runs it on every torch it names."""

from __future__ import annotations

import importlib.util
import re
import sys

from conftest import ROOT

spec = importlib.util.spec_from_file_location("compat_features", ROOT / "benchmarks/compat_features.py")
compat = importlib.util.module_from_spec(spec)
sys.modules["compat_features"] = compat
spec.loader.exec_module(compat)

ESTIMATE = compat.Feature("f", "f", ("estimate", "mlp:10-5"))
DOES_NOT_FIT = compat.Feature("oom", "oom", ("estimate", "mlp:10-5"), ok=(1,))
REFUSAL = ("trainmem: error: --strategy fsdp needs torch >= 2.7 (this is torch 2.6.0+cu124; fake tensors have "
           "kernels for c10d's collectives from torch 2.7)\n")
WARNING = ("/venv/lib/python3.11/site-packages/transformers/modeling_utils.py:3312: FutureWarning: "
           "`is_gradient_checkpointing` is deprecated\n  warnings.warn(\n")
TRACEBACK = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
             "ImportError: cannot import name '_clear_sharding_prop_cache'\n")


def test_the_expected_exit_code_passes_and_a_traceback_never_does():
    assert compat.feature_verdict(ESTIMATE, 0, "") == ("pass", "")
    assert compat.feature_verdict(ESTIMATE, 0, WARNING) == ("pass", "")
    assert compat.feature_verdict(DOES_NOT_FIT, 1, "") == ("pass", "")
    assert compat.feature_verdict(ESTIMATE, 1, "trainmem: error: boom\n") == ("FAIL", "exit 1: trainmem: error: boom")
    verdict, reason = compat.feature_verdict(ESTIMATE, 0, TRACEBACK)
    assert verdict == "FAIL" and reason.endswith("cannot import name '_clear_sharding_prop_cache'")
    assert compat.feature_verdict(ESTIMATE, None, "")[0] == "FAIL"


def test_a_refusal_is_one_line_with_exit_2_naming_the_torch_it_needs():
    verdict, reason = compat.feature_verdict(ESTIMATE, 2, WARNING + REFUSAL)  # a library's warning is not a line
    assert verdict == "refused" and reason.startswith("--strategy fsdp needs torch >= 2.7")
    assert compat.feature_verdict(ESTIMATE, 2, REFUSAL.replace(">=", "≥"))[0] == "refused"
    assert compat.feature_verdict(ESTIMATE, 2, "trainmem: error: expected a layer list\n")[0] == "FAIL"
    assert compat.feature_verdict(ESTIMATE, 2, REFUSAL + "trainmem: error: again\n")[0] == "FAIL"
    assert compat.feature_verdict(ESTIMATE, 2, TRACEBACK + REFUSAL)[0] == "FAIL"
    assert compat.feature_verdict(ESTIMATE, 1, REFUSAL)[0] == "FAIL"


def test_every_feature_the_issue_lists_is_in_the_matrix_once():
    ids = [feature.id for feature in compat.FEATURES]
    assert len(ids) == len(set(ids))
    commands = [" ".join(feature.argv) for feature in compat.FEATURES]
    for needed in ("--device a100-40gb", "--precision bf16-mixed", "--checkpointing", "--max-seq", "--sweep",
                   "--tp 2", "--pp 2", "--gpus 2xh100-80gb", "hf:", "--lora", "--qlora", "--keras-backend torch"):
        assert any(needed in command for command in commands), needed
    for kind in ("ddp", "fsdp", "hsdp", "zero1", "zero2", "zero3"):
        assert any("estimate mlp:256-512-512-10" in c and f"--strategy {kind} " in c for c in commands), kind
    assert {command.split()[0] for command in commands} == {"estimate", "fit", "compare", "plan", "measure"}
    assert any(c.startswith("measure") and "--strategy ddp" in c for c in commands)


def test_make_compat_runs_the_features_on_every_version_it_builds():
    makefile = (ROOT / "Makefile").read_text()
    versions = re.search(r"^COMPAT_VERSIONS := (.*)$", makefile, re.M).group(1).split()
    assert len(versions) >= 5
    compat_target = makefile[makefile.index("\ncompat:"):]
    assert "compat.py features" in compat_target and "--features" in compat_target
