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
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert code == 0 and "cpu" in names[:2]  # after a header row, where the table has one


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
    assert code == 2 and err.startswith("trainmem: error: --input-shape: expected an input the model can take")
    assert "its forward failed in module model (Linear)" in err and "Traceback" not in err


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


@pytest.mark.heavy
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


# Peak RSS growth of one CLI run over the process after `import torch` and the CLI: a CUDA build of torch
# alone starts 200-400 MB above the CPU build (benchmarks/results/compat.md), so an absolute bound would test
# the build, not the refusal. 400 MB is far below what each refused input costs when it is not refused.
RSS_GROWTH_PROBE = ("import resource, sys\nimport torch\nfrom trainmem.cli import main\n"
                    "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
                    "code = main(['estimate', sys.argv[1]])\n"
                    "print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)")


def test_a_spec_naming_a_device_allocates_nothing_for_real(tmp_path):
    """The refusal comes before any layer is built: the process stays near an empty estimate's RSS."""
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"input": [20000], "layers": [{"linear": {"out_features": 20000, "device": "cpu"}}]}))
    probe = RSS_GROWTH_PROBE
    done = subprocess.run([sys.executable, "-c", probe, str(spec)], capture_output=True, text=True, timeout=120)
    code, growth_kib = map(int, done.stdout.split())
    assert code == 2 and growth_kib < 400_000  # the weight alone would be 1.6 GB


# ---- the CLI contract under hostile input (issue 11, part 3) ---------------------------------------------

def one_line_exit_2(code, out, err, fragment):
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert fragment in err, err


def test_a_factory_that_calls_sys_exit_is_an_error_not_success(tmp_factory, capsys):
    ref = tmp_factory("import sys\n\ndef factory():\n    sys.exit(0)\n")
    code, out, err = run(["estimate", ref, "--input-shape", "4"], capsys)
    one_line_exit_2(code, out, err, "expected the factory to return an nn.Module, it called sys.exit(0)")


def test_a_file_that_calls_sys_exit_when_loaded(tmp_factory, capsys):
    ref = tmp_factory("import sys\nsys.exit(3)\n\ndef factory():\n    return nn.Linear(4, 2)\n")
    code, out, err = run(["estimate", ref, "--input-shape", "4"], capsys)
    one_line_exit_2(code, out, err, "called sys.exit(3)")


def test_a_forward_that_calls_sys_exit(tmp_factory, capsys):
    ref = tmp_factory("import sys\n\nclass Quits(nn.Linear):\n    def forward(self, x):\n        sys.exit(0)\n\n"
                      "def factory():\n    return Quits(4, 2)\n")
    code, out, err = run(["estimate", ref, "--input-shape", "4"], capsys)
    one_line_exit_2(code, out, err, "expected the model's code to return, it called sys.exit(0)")


PRINTING_FACTORY = ("import os, warnings\n\ndef factory():\n    print('hello from the factory')\n"
                    "    os.write(1, b'a C extension writes to fd 1\\n')\n"
                    "    warnings.warn('a library warns')\n    return nn.Linear(4, 2)\n")


@pytest.mark.heavy
def test_what_the_model_prints_goes_to_stderr_and_json_stays_json(tmp_factory):
    """Python-level prints, writes to file descriptor 1 (C extensions) and warnings: none on stdout."""
    ref = tmp_factory(PRINTING_FACTORY)
    done = subprocess.run([sys.executable, "-m", "trainmem", "estimate", ref, "--input-shape", "4", "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"]["parameters"] == 10
    assert "hello from the factory" in done.stderr and "fd 1" in done.stderr and "a library warns" in done.stderr


def test_prints_in_process_stay_off_stdout(tmp_factory, capsys):
    ref = tmp_factory(PRINTING_FACTORY)
    code, out, err = run(["estimate", ref, "--input-shape", "4", "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["model"]["parameters"] == 10 and "hello from the factory" in err


BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("name, content, said", [
    ("laughs.yaml", BILLION_LAUGHS, "aliases (*name) are not allowed"),  # 10^9 items once expanded
    ("deep.yaml", "input: " + "[" * 5000 + "]" * 5000 + "\n", "nesting deeper than 16 levels"),
    ("deep.json", '{"input": ' + "[" * 100000 + "]" * 100000 + "}", "expected valid JSON"),
    ("big.yaml", "# padding\n" * 200_000, "at most 1,048,576 bytes"),
    ("binary.yaml", bytes(range(256)) * 8, "got binary data"),
    ("layers.json", json.dumps({"input": [4], "layers": ["relu"] * 1001}), "at most 1,000 layers"),
])
def test_hostile_spec_files_are_refused_at_once_without_memory(name, content, said, tmp_path):
    """Each is refused while being read: one line, exit 2, seconds, and the process stays near the RSS
    of importing torch (the laughs alone expanded to 3.3 GB before)."""
    import time

    spec = tmp_path / name
    spec.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert spec.stat().st_size < 2 * 2**20 and (name != "laughs.yaml" or len(BILLION_LAUGHS) < 700)
    probe = RSS_GROWTH_PROBE
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", probe, str(spec)], capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    code, growth_kib = map(int, done.stdout.split())
    assert code == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert len(done.stderr) < 400 and growth_kib < 400_000 and seconds < 60


@pytest.mark.heavy
def test_ctrl_c_ends_a_trace_at_once_with_130_and_one_line(tmp_path):
    """A forward that never ends (Python over fake tensors, as deep models are); SIGINT once it runs."""
    import signal
    import time

    marker = tmp_path / "running"
    model = tmp_path / "endless.py"
    model.write_text("import pathlib, torch.nn as nn\n\nclass Endless(nn.Linear):\n    def forward(self, x):\n"
                     f"        pathlib.Path({str(marker)!r}).touch()\n        while True:\n            x = x + 0\n\n"
                     "def factory():\n    return Endless(4, 2)\n")
    child = subprocess.Popen([sys.executable, "-m", "trainmem", "estimate", f"{model}:factory", "--input-shape", "4"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), child.stderr.read() if child.poll() is not None else "the forward never started"
        time.sleep(0.5)  # deep inside the loop now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=10)
        assert time.monotonic() - sent < 2
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130 and out == b"" and err == b"trainmem: interrupted\n"


# Options that do not apply: refused where the user surely meant something else, warned where harmless.
@pytest.mark.parametrize("args, where, said", [
    (["estimate", "mlp:10-3", "--seq-len", "128"], "--seq-len", "expected an hf: model"),
    (["estimate", "mlp:10-3", "--task", "causal-lm"], "--task", "expected an hf: model"),
    (["estimate", "mlp:10-3", "--qlora"], "--qlora", "got --device cpu"),
    (["estimate", "mlp:10-3", "--qlora", "--device", "t4"], "--qlora", "got --device t4 (compute capability 7.5)"),
    (["estimate", "mlp:10-3", "--cuda-context", "1GiB"], "--cuda-context", "got --device cpu"),
    (["estimate", "mlp:10-3", "--alloc-conf", "expandable_segments:True"], "--alloc-conf", "got --device cpu"),
    (["estimate", "mlp:10-3", "--cuda-version", "12.4"], "--cuda-version", "got --device cpu"),
    (["estimate", "mlp:10-3", "--module-loading", "eager"], "--module-loading", "got --device cpu"),
    (["estimate", "mlp:10-3", "--cudnn-benchmark"], "--cudnn-benchmark", "got --device cpu"),
    (["fit", "mlp:10-3", "--batch-size", "8"], "--batch-size", "fit searches the batch size"),
    (["estimate", "--depth", "0", "mlp:10-3"], "--depth", "at least 1"),
])
def test_options_that_do_not_apply_are_refused(args, where, said, capsys):
    code, out, err = run(args, capsys)
    one_line_exit_2(code, out, err, said)
    assert err.startswith(f"trainmem: error: {where}: expected")


@pytest.mark.parametrize("flag", ["--activation gelu", "--dropout 0.1"])
def test_mlp_options_on_another_model_are_refused(flag, tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    return nn.Linear(4, 2)\n")
    code, out, err = run(["estimate", ref, "--input-shape", "4", *flag.split()], capsys)
    one_line_exit_2(code, out, err, f"{flag.split()[0]}: expected an mlp: model")


def test_harmless_options_that_do_not_apply_are_warned(capsys):
    code, out, err = run(["estimate", "mlp:10-3", "--input-shape", "10", "--input-max", "7", "--batch-size", "2"], capsys)
    assert code == 0 and "Breakdown" in out
    assert err.strip() == ("warning: --input-max: ignored: it bounds the values of integer inputs and every input here "
                           "is floating point (--input-dtype)")


def test_fit_batch_size_with_max_seq_is_legitimate(capsys):
    code, out, err = run(["fit", "mlp:64-10", "--input-shape", "16,64", "--batch-size", "4", "--max-seq",
                          "--device", "custom:capacity=400MiB,cc=8.0", "--format", "json"], capsys)
    assert code in (0, 1) and json.loads(out)["dimension"] == "sequence length", err


def test_qlora_on_t4_names_qlora_and_passes_with_fp16(capsys):
    code, out, err = run(["estimate", "mlp:64-64-10", "--qlora", "--device", "t4"], capsys)
    one_line_exit_2(code, out, err, "--qlora: expected a GPU with bf16")
    assert "--precision:" not in err
    code, out, err = run(["estimate", "mlp:64-64-10", "--qlora", "--device", "t4", "--precision", "fp16-mixed",
                          "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["model"]["quantized_parameters"] > 0, err


def test_setup_flag_for_names_what_filled_a_value():
    from trainmem.setup import TrainingSetup

    assert TrainingSetup(qlora=True, precision="bf16-mixed").flag_for("precision").startswith("--qlora")
    assert TrainingSetup(precision="bf16-mixed").flag_for("precision") == "--precision"


# --setup FILE.toml: every option's key; a bad value names the file and the key; flags override the file.
def test_setup_file_takes_device_and_run_options_and_flags_override_it(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('batch_size = 4\ninput_shape = "64"\ndevice = "a100-40gb"\ncuda_context = "500MiB"\n'
                    'format = "json"\ndepth = 1\n')
    code, out, err = run(["estimate", "mlp:64-10", "--setup", str(toml)], capsys)
    result = json.loads(out)
    assert code == 0 and result["device"]["kind"] == "cuda" and result["setup"]["batch_size"] == 4, err
    assert result["peak"]["process_bytes"] == result["peak"]["reserved_bytes"] + 500 * 2**20
    code, out, err = run(["estimate", "mlp:64-10", "--setup", str(toml), "--batch-size", "8", "--device",
                          "a100-80gb"], capsys)
    result = json.loads(out)
    assert code == 0 and result["setup"]["batch_size"] == 8 and "80" in result["device"]["name"], err


@pytest.mark.parametrize("content, said", [
    ("batch_size = -4\n", "run.toml: batch_size: expected a positive integer, got -4"),
    ('batch_size = "256"\n', "run.toml: batch_size: expected a positive integer, got '256'"),
    ('optimizer = "adamx"\n', "run.toml: optimizer: expected sgd|momentum"),
    ('input_shape = "3,,4"\n', "run.toml: input_shape: expected comma-separated"),
    ("checkpointing = 1\n", "run.toml: checkpointing: expected true or false"),
    ("batchsize = 4\n", "run.toml: expected a known key, got 'batchsize' (did you mean batch_size?"),
    ('cuda_context = "1GiB"\n', "run.toml: cuda_context: expected a GPU --device"),
    ("depth = 0\n", "run.toml: depth: expected a whole number of at least 1"),
    ("batch_size = \n", "run.toml: expected valid TOML"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "run.toml: expected valid TOML"),
    ("# padding\n" * 10_000, "at most 65,536 bytes"),
    (bytes(range(256)), "binary data"),
])
def test_setup_file_errors_name_the_file_and_key(content, said, tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, out, err = run(["estimate", "mlp:64-10", "--setup", str(toml)], capsys)
    one_line_exit_2(code, out, err, said)
    assert len(err) < 600


def test_another_commands_key_in_a_setup_file_is_warned(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text("margin = 0.2\nbatch_size = 2\n")
    code, out, err = run(["estimate", "mlp:64-10", "--setup", str(toml)], capsys)
    assert code == 0 and err.strip() == f"warning: {toml}: margin: ignored: only trainmem fit and plan keep a margin"


# Inputs the model cannot take: the flag that made the batch is blamed, with the module and torch's words.
def test_a_linear_fed_int64_is_refused_as_for_real(tmp_factory, capsys):
    """Real torch: 'mat1 and mat2 must have the same dtype'; fake tensors' meta addmm does not check."""
    ref = tmp_factory("def factory():\n    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))\n")
    code, out, err = run(["estimate", ref, "--input-shape", "8", "--input-dtype", "int64"], capsys)
    one_line_exit_2(code, out, err, "--input-dtype: expected an input the model can take")
    assert "module 0 (Linear)" in err and "same dtype" in err
    code, out, err = run(["estimate", ref, "--input-shape", "8", "--input-dtype", "float64", "--format", "json"], capsys)
    assert code == 2 and "--input-dtype" in err  # float64 into float32 weights: refused for real as well


def test_same_dtype_rule_matches_the_real_kernels():
    """The ops dtype_checks refuses are exactly those whose real CPU kernel refuses mixed dtypes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainmem.trace.dtype_checks import SameDtypeKernels

    calls = {
        "linear": lambda d: torch.nn.functional.linear(torch.ones(2, 3, dtype=d), torch.ones(2, 3), torch.ones(2)),
        "matmul": lambda d: torch.matmul(torch.ones(2, 2, 3, dtype=d), torch.ones(3, 2)),
        "mv": lambda d: torch.mv(torch.ones(2, 3, dtype=d), torch.ones(3)),
        "conv2d": lambda d: torch.nn.functional.conv2d(torch.ones(1, 3, 8, 8, dtype=d), torch.ones(4, 3, 3, 3)),
        "add": lambda d: torch.ones(2, dtype=d) + torch.ones(2),  # type promotion: fine for real and here
    }
    for name, call in calls.items():
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            try:
                call(dtype)
                real = True
            except RuntimeError:
                real = False
            try:
                with FakeTensorMode(allow_non_fake_inputs=True), SameDtypeKernels():
                    call(dtype)
                traced = True
            except RuntimeError:
                traced = False
            assert real == traced, (name, dtype, real, traced)


def test_a_shape_the_model_cannot_take_blames_input_shape(tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 30 * 30, 10))\n")
    code, out, err = run(["estimate", ref, "--input-shape", "3,32,31"], capsys)
    one_line_exit_2(code, out, err, "--input-shape: expected an input the model can take, got --input-shape 3,32,31")
    assert "module 2 (Linear)" in err and "Traceback" not in err


# --help: every reference kind, every optimizer, each flag's default as a run uses it.
def test_help_lists_references_optimizers_and_real_defaults():
    import dataclasses

    from trainmem.cli import build_parser
    from trainmem.setup import Optimizer, TrainingSetup

    parser = build_parser()
    estimate = parser._subparsers._group_actions[0].choices["estimate"]
    text = " ".join(estimate.format_help().split())
    for kind in ("mlp:", "net.yaml", "file.py:factory", "package.module:factory", "torchvision:", "timm:", "hf:",
                 ".onnx", ".safetensors", ".pt"):
        assert kind in text, kind
    assert all(member.value in text for member in Optimizer)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingSetup)}
    by_flag = {action.option_strings[0]: action.help for action in estimate._actions if action.option_strings}
    for name in ("batch_size", "optimizer", "optimizer_impl", "precision", "grad_accum", "zero_grad", "activation",
                 "dropout", "loop"):
        assert f"(default: {defaults[name]})" in by_flag["--" + name.replace("_", "-")], name
    for flag, action in by_flag.items():
        assert action is None or "(default:" in action or flag in ("-h", "--setup", "--debug", "--trace-steps"), flag
    assert "(default: a long run" in by_flag["--steps"]
    assert "(default: cpu)" in by_flag["--device"] and "(default: 2)" in by_flag["--depth"]


# The Python API takes shapes as Python values.
@pytest.mark.parametrize("shape", [10, (10,), [10], "10"])
def test_python_api_input_shape_values(shape):
    import trainmem

    result = trainmem.estimate("mlp:10-2", input_shape=shape, batch_size=2)
    assert result.setup.inputs[0].shape == (10,)


@pytest.mark.parametrize("shape", [True, -3, (3, True), 10.5, (3, -1), []])
def test_python_api_refuses_bad_shapes(shape):
    import trainmem

    with pytest.raises(trainmem.TrainmemError, match="input_shape"):
        trainmem.estimate("mlp:10-2", input_shape=shape)


@pytest.mark.parametrize("args, said", [
    (["--batch-size", "1" + "0" * 30], "--batch-size: expected a batch size within a tensor's int64 element count"),
    (["--input-shape", "1000000000,1000000000,100"], "--input-shape: expected a batch within a tensor's int64"),
    (["--batch-size", "100000000000000000", "--input-shape", "1000"], "--batch-size: expected a batch within"),
    (["--grad-accum", "1000000000"], "--grad-accum: expected at most 1,024 micro-batches"),
    (["--input-shape", "10", "--input-dtype", "bool"], "--input-dtype: expected an input the model can take"),
])
def test_sizes_beyond_what_torch_can_make_name_the_flag(args, said, capsys):
    code, out, err = run(["estimate", "mlp:10-5", *args], capsys)
    one_line_exit_2(code, out, err, said)


def test_make_batch_and_loss_fn_that_return_the_wrong_thing(tmp_factory, capsys):
    ref = tmp_factory("def factory():\n    return nn.Linear(4, 2), lambda batch_size: 'text'\n")
    code, out, err = run(["estimate", ref], capsys)
    one_line_exit_2(code, out, err, "make_batch: expected make_batch(1) to return a tensor, a tuple of tensors or a dict, got str")
    ref = tmp_factory("def factory():\n    return nn.Linear(4, 2), lambda b: torch.randn(b, 4), lambda out, inputs: out\n")
    code, out, err = run(["estimate", ref], capsys)
    one_line_exit_2(code, out, err, "loss_fn: expected the loss to be a scalar tensor, got shape [1, 2]")


def test_a_reference_too_long_for_the_file_system(capsys):
    code, out, err = run(["estimate", "a" * 100_000 + ".py:factory"], capsys)
    one_line_exit_2(code, out, err, "expected an existing Python file")
    assert len(err) < 400


def test_a_device_from_a_setup_file_is_blamed_on_the_file(tmp_path, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text('device = "h900"\n')
    code, out, err = run(["estimate", "mlp:10-5", "--setup", str(toml)], capsys)
    one_line_exit_2(code, out, err, f"{toml}: device: expected a device among")


def test_measure_runs_are_bounded(capsys):
    code, out, err = run(["measure", "mlp:10-5", "--runs", "1000000"], capsys)
    one_line_exit_2(code, out, err, "--runs: expected at most 20 runs, got 1,000,000")


def test_trainmem_itself_as_the_factory_does_not_recurse(capsys):
    code, out, err = run(["estimate", "trainmem.cli:main", "--input-shape", "4"], capsys)
    one_line_exit_2(code, out, err, "expected a model factory, got trainmem's own command line")


def test_control_characters_in_a_reference_are_escaped(capsys):
    code, out, err = run(["estimate", "model\x00.py:factory"], capsys)
    one_line_exit_2(code, out, err, "model\\x00.py:factory: expected an existing Python file")
    assert "\x00" not in err


@pytest.mark.parametrize("content, said", [
    (b"", "expected a checkpoint, got an empty file"),
    (bytes(range(256)) * 16, "expected a checkpoint that torch.load(weights_only=True) accepts"),
])
def test_unreadable_checkpoints_are_one_short_line(content, said, tmp_path, capsys):
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    code, out, err = run(["estimate", str(path)], capsys)
    one_line_exit_2(code, out, err, said)
    assert "model.pt" in err and len(err) < 400


def test_a_safetensors_header_cannot_claim_more_than_the_file_holds(tmp_path, capsys):
    import struct

    header = json.dumps({"weight": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    code, out, err = run(["estimate", str(path)], capsys)
    one_line_exit_2(code, out, err, "expected tensor 'weight' whose data_offsets span shape × itemsize bytes")


# ---- PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF in the environment (cli/options.py with_environment) ----

ENV_RUN = ["estimate", "mlp:256-256-10", "--input-shape", "256", "--batch-size", "8", "--format", "json"]


def _settings(capsys, args):
    code = main(args)
    captured = capsys.readouterr()
    data = json.loads(captured.out) if code == 0 else None
    return code, (data or {}).get("allocator", {}).get("settings"), captured.err


def test_the_environments_allocator_settings_are_the_runs(monkeypatch, capsys):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    code, settings, err = _settings(capsys, [*ENV_RUN, "--device", "a100-40gb"])
    assert code == 0 and settings == "expandable_segments=True"
    assert "allocator settings 'expandable_segments:True' from PYTORCH_CUDA_ALLOC_CONF in the environment" in err
    # the flag wins; on the CPU the variable means nothing and is not read
    code, settings, err = _settings(capsys, [*ENV_RUN, "--device", "a100-40gb", "--alloc-conf", "max_split_size_mb:64"])
    assert code == 0 and "expandable" not in settings and "environment" not in err
    code, _, err = _settings(capsys, ENV_RUN)
    assert code == 0 and "environment" not in err


def test_pytorch_cuda_alloc_conf_is_read_before_pytorch_alloc_conf(monkeypatch, capsys):
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    code, settings, err = _settings(capsys, [*ENV_RUN, "--device", "a100-40gb"])
    assert code == 0 and "from PYTORCH_ALLOC_CONF in the environment" in err
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    code, settings, err = _settings(capsys, [*ENV_RUN, "--device", "a100-40gb"])
    assert code == 0 and settings == "expandable_segments=True"


@pytest.mark.parametrize(("value", "says"), [
    ("garbage", "expected allocator settings (key:value,…), allocator setting 'garbage'"),
    ("backend:cudaMallocAsync", "expected the native caching allocator, got backend:cudaMallocAsync"),
])
def test_bad_settings_in_the_environment_name_the_variable(monkeypatch, capsys, value, says):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", value)
    code, _, err = _settings(capsys, [*ENV_RUN, "--device", "a100-40gb"])
    assert code == 2 and err.startswith(f"trainmem: error: PYTORCH_CUDA_ALLOC_CONF in the environment: {says}")
