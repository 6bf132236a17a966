"""The GPU measurement harness, checked where it can be without a GPU."""

import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from trainmem.errors import MeasureError
from trainmem.measure import cuda
from trainmem.measure.single_process import run_child
from trainmem.setup import TrainingSetup


def test_nvidia_smi_process_row_is_parsed(monkeypatch):
    monkeypatch.setattr(cuda, "_nvidia_smi", lambda query, what: [["123", "4567"], ["999", "1"]])
    assert cuda.process_used_bytes(123) == 4567 * 2**20
    assert cuda.process_used_bytes(5) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cuda_mode_without_a_gpu_is_one_clear_error():
    with pytest.raises(MeasureError, match="expected a CUDA device for --device cuda, found none"):
        run_child("mlp:10-2", TrainingSetup(batch_size=2), "cuda")


@pytest.mark.heavy
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_benchmark_writes_nothing_without_a_gpu(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_measure.py"), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "nothing measured" in done.stdout and not out.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_measurement_reports_the_three_numbers():
    result = run_child("mlp:1000-100-10", TrainingSetup(batch_size=64, optimizer="adam"), "cuda")
    assert 0 < result["max_memory_allocated"] <= result["max_memory_reserved"]
    assert result["gpu"] and result["cuda"] and result["torch"]
