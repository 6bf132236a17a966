"""CLI: exit codes, JSON schema, one-line errors for bad input."""

import json
import subprocess
import sys

import pytest

from trainmem.cli import main

SEED = ["estimate", "mlp:1000-100-100-100-100-10", "--input-shape", "1000", "--batch-size", "256", "--optimizer", "adam"]


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_schema(capsys):
    code, out, _ = run(SEED + ["--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert set(data) >= {"trainmem_version", "model", "setup", "device", "peak", "breakdown", "fits"}
    assert set(data["peak"]) >= {"tensor_bytes", "allocated_bytes", "reserved_bytes", "process_bytes", "phase", "module", "op"}
    assert set(data["breakdown"]) >= {"parameters", "buffers", "gradients", "optimizer_state", "activations",
                                      "temporaries", "inputs", "runtime"}
    assert all(isinstance(v, int) for v in data["breakdown"].values())
    assert sum(data["breakdown"].values()) == data["peak"]["tensor_bytes"]
    assert data["peak"]["reserved_bytes"] is None and data["device"]["kind"] == "cpu"


def test_table_report(capsys):
    code, out, _ = run(SEED, capsys)
    assert code == 0
    assert "Breakdown at the peak" in out and "How this adds up" in out and "1,820 values" in out


def test_devices(capsys):
    code, out, _ = run(["devices"], capsys)
    assert code == 0 and out.startswith("cpu")


@pytest.mark.parametrize("args,fragment", [
    (["estimate", "nonsense"], "expected a model reference"),
    (["estimate", "mlp:10-x-3"], "expected mlp:IN-HIDDEN"),
    (["estimate", "mlp:10-3", "--batch-size", "-4"], "--batch-size: expected a positive integer, got -4"),
    (["estimate", "mlp:10-3", "--optimizer", "adamx"], "--optimizer: expected sgd|momentum"),
    (["estimate", "mlp:10-3", "--precision", "fp8"], "--precision: expected fp32"),
    (["estimate", "mlp:10-3", "--input-shape", "3,-1"], "--input-shape: expected comma-separated positive"),
    (["estimate", "mlp:10-3", "--input-shape", "10", "--input-dtype", "float128"], "--input-dtype: expected an input dtype"),
    (["estimate", "missing_file.py:factory"], "expected an existing Python file"),
    (["estimate", "no_such_pkg_xyz.module:factory"], "expected an importable module"),
    (["estimate", "net.yaml"], "expected an existing spec file"),
    (["estimate", "mlp:10-3", "--freeze", "nothing*"], "it matched none"),
    (["estimate", "mlp:10-3", "--device", "tpu"], "--device: expected a device"),
    (["estimate", "mlp:10-3", "--optimizer", "rmsprop", "--optimizer-impl", "fused"], "fused implementation"),
])
def test_bad_input_is_one_line_exit_2(args, fragment, capsys):
    code, out, err = run(args, capsys)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_factory_that_raises(tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    raise ValueError('no weights here')\n")
    code, _, err = run(["estimate", ref, "--input-shape", "4"], capsys)
    assert code == 2 and "the factory raised ValueError: no weights here" in err


def test_forward_that_fails_on_the_input(tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    return nn.Linear(8, 2)\n")
    code, _, err = run(["estimate", ref, "--input-shape", "5"], capsys)
    assert code == 2 and "failed in phase forward" in err and "Traceback" not in err


def test_missing_input_shape(tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    return nn.Linear(8, 2)\n")
    code, _, err = run(["estimate", ref], capsys)
    assert code == 2 and "expected --input-shape" in err


def test_debug_shows_traceback():
    done = subprocess.run([sys.executable, "-m", "trainmem", "estimate", "nonsense", "--debug"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "Traceback" in done.stderr


def test_setup_from_toml(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('batch_size = 256\noptimizer = "adam"\ninput_shape = "1000"\n')
    code, out, _ = run(["estimate", "mlp:1000-100-100-100-100-10", "--setup", str(toml), "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["breakdown"]["optimizer_state"] == 1051280


def test_spec_files(tmp_path, capsys):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"input": [3, 16, 16], "layers": [
        {"conv2d": {"out_channels": 8, "kernel_size": 3, "padding": 1}}, "batchnorm", "relu",
        {"maxpool2d": {"kernel_size": 2}}, "flatten", {"linear": {"out_features": 10}}]}))
    code, out, _ = run(["estimate", str(spec), "--batch-size", "4", "--format", "json"], capsys)
    assert code == 0
    assert json.loads(out)["model"]["parameters"] == (3 * 9 * 8 + 8) + 16 + (8 * 8 * 8 * 10 + 10)
    yaml_spec = tmp_path / "lm.yaml"
    yaml_spec.write_text("input: [12]\ninput_dtype: int64\nlayers:\n  - embedding: {num_embeddings: 50, embedding_dim: 16}\n"
                         "  - lstm: {hidden_size: 32}\n  - gru: {hidden_size: 8}\n  - layernorm\n  - linear: {out_features: 50}\n")
    code, out, err = run(["estimate", str(yaml_spec), "--batch-size", "2", "--format", "json"], capsys)
    assert code == 0, err


def test_bad_spec(tmp_path, capsys):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"input": [4], "layers": ["linear"]}))
    code, _, err = run(["estimate", str(spec)], capsys)
    assert code == 2 and "layer 0 (linear" in err


def test_measure_refuses_what_does_not_fit(capsys):
    code, _, err = run(["measure", "mlp:100000-100000-10", "--batch-size", "1"], capsys)
    assert code == 2 and "use --force" in err


def test_does_not_fit_exits_1(capsys):
    code, out, _ = run(["estimate", "mlp:100000-100000-10", "--batch-size", "1"], capsys)
    assert code == 1 and "DOES NOT FIT" in out


def test_two_inputs_from_flags(tmp_factory, capsys):
    ref = tmp_factory("class Two(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.embed = nn.Embedding(100, 8)\n        self.proj = nn.Linear(4, 8)\n"
                      "        self.head = nn.Linear(8, 3)\n"
                      "    def forward(self, ids, features):\n"
                      "        return self.head(self.embed(ids).mean(1) + self.proj(features))\n\n"
                      "def factory():\n    return Two()\n")
    code, out, err = run(["estimate", ref, "--input-shape", "12", "--input-dtype", "int64", "--input-max", "100",
                          "--input-shape", "4", "--input-dtype", "float32", "--input-max", "2", "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert [i["shape"] for i in data["setup"]["inputs"]] == [[12], [4]]
    assert data["model"]["parameters"] == 100 * 8 + 4 * 8 + 8 + 8 * 3 + 3


def test_data_dependent_shape_names_op_and_module(tmp_factory, capsys):
    ref = tmp_factory("class Picky(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.gate = nn.Linear(4, 4)\n"
                      "    def forward(self, x):\n        y = self.gate(x)\n        return y[torch.nonzero(y > 0, as_tuple=True)].sum()\n\n"
                      "def factory():\n    return Picky()\n")
    code, _, err = run(["estimate", ref, "--input-shape", "4", "--loss", "sum"], capsys)
    assert code == 2 and "aten.nonzero" in err and "Traceback" not in err


def test_value_read_is_assumed_and_warned(tmp_factory, capsys):
    ref = tmp_factory("class Branchy(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                      "        self.a = nn.Linear(4, 2)\n        self.b = nn.Linear(4, 2)\n"
                      "    def forward(self, x):\n        return self.a(x) if x.sum().item() > 0 else self.b(x)\n\n"
                      "def factory():\n    return Branchy()\n")
    code, out, err = run(["estimate", ref, "--input-shape", "4"], capsys)
    assert code == 0
    assert "aten._local_scalar_dense" in err and "value read as 0" in err


def test_target_shape_comes_with_the_batch(capsys):
    base = ["estimate", "mlp:64-16-10", "--batch-size", "32", "--format", "json"]
    code, out, _ = run(base + ["--target-shape", "scalar"], capsys)
    assert code == 0 and json.loads(out)["setup"]["target_shape"] == []
    code, out, _ = run(base + ["--loss", "mse", "--target-shape", "10"], capsys)
    assert code == 0 and json.loads(out)["breakdown"]["inputs"] >= 32 * (64 + 10) * 4  # batch and target at the peak


@pytest.mark.parametrize("args,fragment", [
    (["--loss", "mse", "--target-shape", "3"], "expected --target-shape to match the output [10], got [3]"),
    (["--target-shape", "4"], "class ids for this output"),
    (["--loss", "sum", "--target-shape", "4"], "no --target-shape with --loss sum"),
])
def test_bad_target_shape(args, fragment, capsys):
    code, _, err = run(["estimate", "mlp:64-16-10", "--batch-size", "8", *args], capsys)
    assert code == 2 and fragment in err


def test_gpu_devices_are_listed_and_estimated(capsys):
    code, out, _ = run(["devices", "--format", "json"], capsys)
    gpus = {d["name"]: d for d in json.loads(out) if d["kind"] == "cuda"}
    assert code == 0 and gpus["h100-80gb"]["cublas_workspace_bytes"] == 32 * 2**20 and gpus["a100-40gb"]["bf16"]
    code, out, _ = run(["estimate", "mlp:10-2", "--device", "a100-40gb", "--format", "json",
                        "--cuda-context", "500MiB"], capsys)
    result = json.loads(out)
    assert code == 0 and result["device"]["kind"] == "cuda"
    peak = result["peak"]
    assert peak["allocated_bytes"] <= peak["reserved_bytes"] == result["process"]["reserved"]
    assert peak["process_bytes"] == peak["reserved_bytes"] + 500 * 2**20
    assert result["allocator"]["segments_at_peak"] >= 1


def test_gpu_that_does_not_fit_exits_1(capsys):
    code, out, _ = run(["estimate", "mlp:4096-4096-4096", "--input-shape", "4096", "--batch-size", "4",
                        "--device", "custom:capacity=300MiB,cc=8.0", "--cuda-context", "100MiB"], capsys)
    assert code == 1 and "DOES NOT FIT" in out and "runs out of memory" in out


def test_fit_finds_the_largest_batch(capsys):
    code, out, _ = run(["fit", "mlp:256-256-10", "--input-shape", "256", "--device",
                        "custom:capacity=400MiB,cc=8.0,context=287MB", "--format", "json"], capsys)
    result = json.loads(out)
    best, miss = result["best"], result["first_miss"]
    assert code == 0 and miss == best + 1
    fits = {row["value"]: row["fits"] for row in result["tried"]}
    assert fits[best] and not fits[miss]


def test_fit_explains_what_to_change_when_nothing_fits(capsys):
    code, out, _ = run(["fit", "mlp:4096-4096-4096", "--input-shape", "4096", "--optimizer", "adam",
                        "--device", "custom:capacity=400MiB,cc=8.0", "--cuda-context", "100MiB"], capsys)
    assert code == 1 and "Even batch size 1 does not fit" in out
    assert "8-bit Adam" in out and "checkpointing" in out and "mixed precision" in out


def test_measure_on_a_gpu_needs_one(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run(["measure", "mlp:8-8", "--input-shape", "8", "--device", "cuda"], capsys)
    assert code == 2 and "expected a CUDA GPU on this machine" in err


# Hostile and careless input: one line naming the flag, exit 2, before anything is built or traced.
WIDE = "mlp:99999999999999999999-10"
DEEP = "mlp:" + "-".join(["16"] * 1002)


@pytest.mark.parametrize("args, where", [
    (["estimate", WIDE], "int64 element count"),  # torch would fail in C++ with pages of frames
    (["estimate", DEEP], "at most 1,000 layers"),
    (["estimate", "mlp:10-10", "--input-shape", "3,,4"], "--input-shape"),  # not read as 3,4
    (["estimate", "mlp:10-10", "--input-shape", "3,"], "--input-shape"),
    (["estimate", "mlp:10-10", "--max-grad-norm", "-1"], "--max-grad-norm"),
    (["estimate", "mlp:10-10", "--max-grad-norm", "0"], "--max-grad-norm"),
    (["estimate", "mlp:10-10", "--max-grad-norm", "nan"], "--max-grad-norm"),
])
def test_hostile_input_is_one_line_and_exit_2(args, where, capsys):
    code, out, err = run(args, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and where in err and "Traceback" not in err
    assert len(err) < 300  # a 4,000-character reference is not echoed back whole


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    from trainmem import __version__

    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"trainmem {__version__}"


def test_closed_pipe_is_quiet_and_never_exit_1():
    """`trainmem devices | head -1`: the reader has gone away when we write; that says nothing about fitting.
    The pipe's read end is closed before the child starts, so its first write fails whatever the timing."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "trainmem", "devices"], stdout=write_end,
                              stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == b""


@pytest.mark.parametrize("layer, said", [
    # device would build the layer outside the meta device: a 20000 × 20000 Linear is 1.6 GB for real
    ({"linear": {"out_features": 20000, "device": "cpu"}}, "got 'device'"),
    ({"linear": {"out_features": 10, "dtype": "float64"}}, "got 'dtype'"),
    ({"linear": {"out_features": 10, "bias": "maybe"}}, "true or false"),
    ({"linear": {"out_features": "10"}}, "a number"),
    ({"lstm": {"hidden_size": 8.5}}, "a number"),
    ({"lstm": {"hidden_size": 8, "batch_first": False}}, "got 'batch_first'"),
    ({"conv1d": {"out_channels": 4, "kernel_size": 3, "__class__": "x"}}, "got '__class__'"),
    ({"conv1d": {"out_channels": 4, "kernel_size": {"a": 1}}}, "a list of numbers"),
])
def test_spec_layer_arguments_are_an_allow_list(layer, said, tmp_path, capsys):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"input": [20000] if "20000" in str(layer) else [4, 10], "layers": [layer]}))
    code, out, err = run(["estimate", str(spec)], capsys)
    assert code == 2 and out == "" and said in err and len(err.strip().splitlines()) == 1


def test_a_spec_naming_a_device_allocates_nothing_for_real(tmp_path):
    """The refusal comes before any layer is built: the process stays near an empty estimate's RSS."""
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"input": [20000], "layers": [{"linear": {"out_features": 20000, "device": "cpu"}}]}))
    probe = ("import resource, sys\nfrom trainmem.cli import main\ncode = main(['estimate', sys.argv[1]])\n"
             "print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", probe, str(spec)], capture_output=True, text=True, timeout=120)
    code, max_rss_kib = map(int, done.stdout.split())
    assert code == 2 and max_rss_kib < 1_000_000  # the weight alone would be 1.6 GB
