"""What a CUDA process holds besides `reserved` (targets/cuda_runtime.py) and cuDNN's transient
convolution workspaces (targets/cudnn.py), checked by hand against the sources those modules cite."""

from __future__ import annotations

import json

import pytest
import torch.nn as nn

from trainmem import estimate
from trainmem.errors import SetupError
from trainmem.targets import cuda_stream as cuda_target
from trainmem.targets.cuda_runtime import EAGER, LAZY, context_fact, resolve_runtime
from trainmem.targets.cudnn import im2col_bytes
from trainmem.trace.events import TensorMeta
from trainmem.setup.target_options import TargetOptions

MiB = 1024**2


def _stream(model: nn.Module, input_shape: str, benchmark: bool, batch: int = 4, **setup):
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.trace.cuda_composites import CudaFacts
    from trainmem.trace.run import trace_training

    training = TrainingSetup.from_mapping({"batch_size": batch, "input_shape": input_shape, **setup}, where="test")
    traced = trace_training(resolve(model, training), training, cuda_target.kernel_ops(), CudaFacts((8, 0)))
    return cuda_target.device_stream(traced.trace, 8_519_680, benchmark)


def _workspaces(events) -> list[tuple[int, str]]:
    return [(e.nbytes, e.op) for e in events if e.action == "alloc" and e.op.startswith("cuDNN")]


def test_context_by_version_and_loading():
    old = context_fact(resolve_runtime("11.2", None, None))  # before 11.7 only eager exists
    assert resolve_runtime("11.2", None, None).module_loading == EAGER
    assert old.point == 1343 * MiB - 2 * MiB  # HF guide: 1343 MiB after torch.ones((1,1)), less its segment
    eager = context_fact(resolve_runtime("11.7", "eager", None))
    lazy = context_fact(resolve_runtime("11.7", "lazy", None))
    assert eager.point == 666_632_192 - 20 * MiB and lazy.point == 287_047_680 - 20 * MiB  # PR #86509
    assert eager.point > lazy.point and lazy.high == 426 * MiB
    assert context_fact(resolve_runtime("12.4", None, None)).point == 256 * MiB
    assert context_fact(resolve_runtime("13.0", None, None), (8, 9)).point == 426 * MiB  # RTX 6000 Ada
    # H200, torch 2.11+cu130 (benchmarks/data/gpu_measurements.jsonl); the larger one when the GPU is not named
    # (context 552,402,944 B + the kernels 3 Adam steps load lazily: 812 MiB beyond reserved on every fp32 gloo rank)
    assert context_fact(resolve_runtime("13.0", None, None), (9, 0)).point == 851_443_712
    assert context_fact(resolve_runtime("13.0", None, None)).point == 851_443_712
    for version in ("11.2", "11.8", "12.1", "13.0"):
        for loading in ((EAGER,) if version == "11.2" else (EAGER, LAZY)):
            fact = context_fact(resolve_runtime(version, loading, None))
            assert fact.high >= fact.point > 0 and fact.source


def test_runtime_refuses_what_cannot_run():
    with pytest.raises(SetupError, match="11.7"):
        resolve_runtime("11.2", "lazy", None)
    with pytest.raises(SetupError, match="cuda-version"):
        resolve_runtime("twelve", None, None)
    with pytest.raises(SetupError, match="module-loading"):
        resolve_runtime("12.1", "sometimes", None)
    with pytest.raises(SetupError, match="GPU --device"):
        estimate("mlp:8-8", input_shape="8", target_options=TargetOptions(cuda_version="12.1"))


# Hand-copied from benchmarks/results/cuda_library_images.md (loaded bytes per library and arch):
CUBLAS_CU11_SM80 = 53_632_736 + 287_223_488  # libcublas.so.11 + libcublasLt.so.11, 11.10.3.66, sm_80
CUBLAS_CU11_SM70 = 54_048_868 + 96_759_120  # same libraries, sm_70
CUDNN_CU11_SM80 = 186_901_395 + 41_672_544 + 44_467_532 + 25_863_472  # cnn_infer, cnn_train, ops_infer, ops_train
CUDNN_ADV_CU11_SM80 = 54_142_700 + 50_571_928  # adv_infer, adv_train (RNN/attention only: high)


def test_eager_estimate_exceeds_lazy_by_the_context_and_cublas_image():
    kw = dict(device="a100-40gb", batch_size=2, input_shape="64")
    cuda_11 = TargetOptions(cuda_version="11.8")
    lazy = estimate("mlp:64-64", target_options=cuda_11.with_values(module_loading="lazy"), **kw)
    eager = estimate("mlp:64-64", target_options=cuda_11.with_values(module_loading="eager"), **kw)
    assert eager.reserved_bytes == lazy.reserved_bytes
    # CUDA 11.8 takes the measured CUDA 11 build (cuBLAS 11.10.3.66); an A100 runs its sm_80 cubins
    assert eager.process_bytes - lazy.process_bytes == (666_632_192 - 287_047_680) + CUBLAS_CU11_SM80
    assert eager.process_parts["library_kernels"] == CUBLAS_CU11_SM80
    assert eager.process_bytes_high == eager.process_bytes  # the eager context has one figure; no cuDNN
    assert "library_kernels" not in lazy.process_parts
    assert lazy.process_bytes_high >= lazy.process_bytes
    assert lazy.process_bytes_high == lazy.reserved_bytes + 426 * MiB  # no convolutions: only the context range
    given = estimate("mlp:64-64", target_options=cuda_11.with_values(cuda_context=500 * MiB), **kw)
    assert given.process_bytes == given.process_bytes_high == given.reserved_bytes + 500 * MiB


def test_eager_adds_library_images_by_arch_and_version():
    # a V100 (sm_70) on CUDA 11.2: eager by force, the CUDA 11 build's sm_70 cubins
    v100 = estimate("mlp:64-64", device="v100-16gb", batch_size=2, input_shape="64",
                    target_options=TargetOptions(cuda_version="11.2"))
    assert v100.process_parts["library_kernels"] == CUBLAS_CU11_SM70
    assert v100.process_bytes == v100.reserved_bytes + 1343 * MiB - 2 * MiB + CUBLAS_CU11_SM70
    # convolutions and batch norm initialise cuDNN too; its adv sub-library only in the high figure
    kw = dict(device="a100-40gb", batch_size=2, input_shape="3,8,8",
              target_options=TargetOptions(cuda_version="11.8", module_loading="eager"))
    conv = estimate(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)), **kw)
    assert conv.process_parts["library_kernels"] == CUBLAS_CU11_SM80 + CUDNN_CU11_SM80
    runtime = conv.coverage["cuda_runtime"]
    assert runtime["library_kernel_bytes_high"] - runtime["library_kernel_bytes"] == CUDNN_ADV_CU11_SM80
    assert conv.process_bytes_high - conv.process_bytes >= CUDNN_ADV_CU11_SM80
    # no build measured has sm_90 cubins for CUDA 11 (11.10 ships PTX only there): said, not sized
    h100 = estimate("mlp:64-64", device="h100-80gb", batch_size=2, input_shape="64",
                    target_options=TargetOptions(cuda_version="11.8", module_loading="eager"))
    assert "library_kernels" not in h100.process_parts
    assert any("no measured build has code for compute capability 9.0" in w for w in h100.warnings)


def test_library_images_on_cpu_and_by_version():
    from trainmem.targets.cuda_runtime import library_image

    cpu = estimate("mlp:64-64", batch_size=2, input_shape="64")
    assert not any("kernel images" in w for w in cpu.warnings) and "library_kernels" not in cpu.process_parts
    # CUDA 12 and 13 take their own builds; CUDA 13 dropped sm_70, so a V100 has none there
    assert library_image("cuBLAS/cuBLASLt", (12, 4), (9, 0)).point == 50_095_744 + 486_007_770
    assert library_image("cuBLAS/cuBLASLt", (13, 0), (7, 0)) is None
    # an sm_89 GPU runs the sm_89 cubins where a module has them, else sm_86 or sm_80 ones
    ada = library_image("cuDNN", (12, 4), (8, 9))
    assert ada.point == library_image("cuDNN", (12, 4), (8, 6)).point > 0  # cuDNN 9.1 ships no sm_89 cubins


def test_im2col_matrix_by_hand():
    # Conv2d(3, 8, 3, padding=1) on 4×3×16×16: (3·3·3) rows × (4·16·16) columns of fp32 = 110,592 B
    x, w, y = TensorMeta((4, 3, 16, 16), 4, "float32"), TensorMeta((8, 3, 3, 3), 4, "float32"), \
        TensorMeta((4, 8, 16, 16), 4, "float32")
    assert im2col_bytes(x, w, y, transposed=False) == 3 * 9 * 4 * 256 * 4 == 110_592
    # ConvTranspose2d(8, 3, 2, stride=2) on 4×8×8×8 → 4×3×16×16 is the data-gradient of a conv 16×16 → 8×8:
    # its matrix has (3·2·2) rows × (4·8·8) columns
    xt, wt, yt = TensorMeta((4, 8, 8, 8), 4, "float32"), TensorMeta((8, 3, 2, 2), 4, "float32"), \
        TensorMeta((4, 3, 16, 16), 4, "float32")
    assert im2col_bytes(xt, wt, yt, transposed=True) == 3 * 4 * 4 * 64 * 4 == 12_288


def test_heuristic_workspace_is_the_im2col_matrix_in_the_high_stream():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    stream = _stream(model, "3,16,16", benchmark=False)
    assert _workspaces(stream.events) == []  # point: implicit GEMM, no workspace
    high = _workspaces(stream.events_high)
    # per step: forward, then backward-filter only (the input needs no gradient); two steps
    assert [op.rsplit(" ", 1)[-1] for _, op in high] == ["forward", "backward-filter"] * 2
    assert {n for n, _ in high} == {110_592}
    frees = [e for e in stream.events_high if e.action == "free" and e.op.startswith("cuDNN")]
    assert len(frees) == len(high)  # transient: freed when the kernel returns


def test_benchmark_workspace_once_per_shape_and_thread():
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                          nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    stream = _stream(model, "4,8,8", benchmark=True)
    tried = _workspaces(stream.events)
    # both convolutions share one shape: forward is benchmarked once on the main thread, backward-data and
    # backward-filter once each on autograd's thread; the second step finds every plan in the cache
    assert sorted(op.rsplit(" ", 1)[-1] for _, op in tried) == ["backward-data", "backward-filter", "forward"]
    assert {n for n, _ in tried} == {4 * 9 * 4 * 64 * 4}
    assert stream.rules["cuDNN convolution workspace: 0 B implicit GEMM (point), im2col matrix (high)"] == 7
    assert any("FFT" in gap for gap in stream.gaps)  # larger candidates are possible and said so


def test_depthwise_fp32_has_no_cudnn_workspace():
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    stream = _stream(model, "4,8,8", benchmark=False)
    assert _workspaces(stream.events_high or stream.events) == []
    assert stream.rules["depthwise convolution on PyTorch's own kernel: no cuDNN workspace"] == 4


def test_workspaces_reach_reserved_and_the_high_figure():
    def model():
        return nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 32 * 32, 10))

    kw = dict(device="a100-40gb", batch_size=64, input_shape="16,32,32")
    off = estimate(model(), **kw)
    on = estimate(model(), target_options=TargetOptions(cudnn_benchmark=True), **kw)
    ws = 16 * 9 * 64 * 1024 * 4  # 37,748,736 B: one im2col matrix, more than the cache holds free
    # benchmark off: the point stream has no workspace; the high stream needs a segment for it
    assert off.coverage["cuda_runtime"]["reserved_bytes_high"] >= off.reserved_bytes + ws
    # benchmark on: the first step's trial workspaces are real allocations, cached afterwards
    assert on.allocated_bytes > off.allocated_bytes and on.reserved_bytes > off.reserved_bytes
    for est in (off, on):
        assert est.process_bytes_high >= est.process_bytes
        assert est.to_dict()["peak"]["process_bytes_high"] == est.process_bytes_high


def test_library_notes_are_reported():
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    est = estimate(conv, device="a100-40gb", batch_size=2, input_shape="3,8,8")
    notes = [w for w in est.warnings if "kernel images" in w]
    assert any(n.startswith("cuDNN") for n in notes) and any(n.startswith("cuBLAS") for n in notes)
    assert any(n.startswith("NCCL") and "single-GPU" in n for n in notes)
    assert all("not added" in n for n in notes if not n.startswith("NCCL"))  # lazy: the bound is stated only
    mlp = estimate("mlp:8-8", device="a100-40gb", batch_size=2, input_shape="8")
    assert not any(w.startswith("cuDNN kernel images") for w in mlp.warnings)
    eager = estimate("mlp:8-8", device="a100-40gb", batch_size=2, input_shape="8",
                     target_options=TargetOptions(module_loading="eager"))
    assert any(w.startswith("cuBLAS/cuBLASLt kernel images") and "eager" in w for w in eager.warnings)


def test_cli_flags_reach_the_report(capsys):
    from trainmem.cli import main

    code = main(["estimate", "mlp:64-64", "--input-shape", "64", "--batch-size", "2", "--device", "a100-40gb",
                 "--cuda-version", "11.8", "--module-loading", "eager", "--cudnn-benchmark", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["coverage"]["cuda_runtime"]["cuda_version"] == "11.8"
    assert out["coverage"]["cuda_runtime"]["module_loading"] == "eager"
    assert out["coverage"]["cuda_runtime"]["cudnn_benchmark"] is True
    assert out["process"]["cuda_context"] == 666_632_192 - 20 * MiB
    assert out["peak"]["process_bytes_high"] >= out["peak"]["process_bytes"]
    assert main(["estimate", "mlp:8-8", "--input-shape", "8", "--cuda-version", "12.1"]) == 2
    assert main(["estimate", "mlp:8-8", "--input-shape", "8", "--device", "a100-40gb",
                 "--module-loading", "lazy", "--cuda-version", "11.2"]) == 2
    capsys.readouterr()
    assert main(["estimate", "mlp:8-8", "--input-shape", "8", "--device", "a100-40gb", "--cuda-version", "12.4"]) == 0
    assert "CUDA 12.4 (given with --cuda-version), lazy module loading" in capsys.readouterr().out


def test_batch_norm_reserve_is_a_stated_gap_only_where_cudnn_runs_it():
    """Normalization.cpp sends fp32/fp16 batch norm to cuDNN (workspace + reserve space sized at run time,
    reported as a gap) and bf16 inputs to PyTorch's own kernel (no reserve)."""
    kw = dict(device="a100-40gb", batch_size=8)
    fp32 = estimate("tests/models.py:cnn_bn", **kw)
    bf16 = estimate("tests/models.py:cnn_bn", precision="bf16-mixed", **kw)
    assert any("batch-norm calls: cuDNN's batch-norm workspace and reserve space" in w for w in fp32.warnings)
    assert not any("reserve space are sized by cuDNN" in w for w in bf16.warnings)
