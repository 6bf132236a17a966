"""TensorFlow's GPU settings in the environment (TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR: cli/options.py
with_environment) and libraries kept quiet on stderr unless --debug (cli/quiet.py): TensorFlow's start-up lines,
the Hugging Face libraries' deprecation warnings."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from conftest import ROOT
from trainmem.cli import main
from trainmem.cli.options import RUN_DEFAULTS, Options, environment_notes, with_environment
from trainmem.cli.quiet import ABSL_RECORD, kept_lines, libraries_quiet
from trainmem.errors import TrainmemError

KERAS_GPU = ["estimate", "mlp:256-64-10", "--framework", "keras", "--input-shape", "256", "--batch-size", "8",
             "--device", "a100-40gb", "--format", "json"]


def _options(model="mlp:256-64-10", device="a100-40gb", **given):
    return Options({**RUN_DEFAULTS, **given, "model": model, "device": device}, given,
                   {key: f"--{key.replace('_', '-')}" for key in given})


def _one_line_exit_2(code, out, err, *fragments):
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("trainmem: error: "), err
    for fragment in fragments:
        assert fragment in err, err


# ---- TF_FORCE_GPU_ALLOW_GROWTH / TF_GPU_ALLOCATOR: read for Keras on TensorFlow on a GPU, nowhere else ----

@pytest.mark.parametrize(("value", "mode"), [("true", "growth"), ("false", "default")])
def test_allow_growth_in_the_environment_is_the_keras_runs_memory_mode(monkeypatch, value, mode):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", value)
    options = with_environment(_options(framework="keras"))
    assert options.tf_memory == mode and options.origins["tf_memory"] == f"TF_FORCE_GPU_ALLOW_GROWTH={value} in the environment"
    assert environment_notes(options) == [f"TensorFlow GPU memory mode '{mode}' from TF_FORCE_GPU_ALLOW_GROWTH={value} "
                                          "in the environment (--tf-memory overrides it)"]


def test_tf_memory_given_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "not even read")
    options = with_environment(_options(framework="keras", tf_memory="limit:8GiB"))
    assert options.tf_memory == "limit:8GiB" and environment_notes(options) == []


@pytest.mark.parametrize("options", [
    _options(framework="keras", device="cpu"),  # TensorFlow's CPU device has no GPU memory mode
    _options(),  # mlp: is a PyTorch model unless --framework keras
    _options(framework="keras", keras_backend="torch"),  # Keras on the torch backend trains on PyTorch's allocator
], ids=["keras-cpu", "pytorch-gpu", "keras-torch-backend"])
def test_the_tensorflow_variables_mean_nothing_elsewhere(monkeypatch, options):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "garbage")
    monkeypatch.setenv("TF_GPU_ALLOCATOR", "cuda_malloc_async")
    assert with_environment(options) == options


def test_a_keras_model_on_tensorflow_ignores_pytorchs_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    factory = tmp_path / "net.py"
    factory.write_text("import keras\n\n\ndef model():\n    return keras.Sequential([keras.layers.Dense(2)])\n")
    for options in (_options(framework="keras"), _options(model=str(tmp_path / "m.keras")),
                    _options(model=f"{factory}:model")):
        assert "alloc_conf" not in with_environment(options).given
    assert with_environment(_options()).alloc_conf == "expandable_segments:True"  # a PyTorch model takes them


def test_keras_backend_in_the_environment_decides_which_variables(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    assert "tf_memory" not in with_environment(_options(framework="keras")).given


@pytest.mark.parametrize(("name", "value", "says"), [
    ("TF_FORCE_GPU_ALLOW_GROWTH", "True", "expected true or false (TensorFlow reads exactly these"),
    ("TF_FORCE_GPU_ALLOW_GROWTH", "1", "got '1'"),
    ("TF_GPU_ALLOCATOR", "cuda_malloc_async", "expected TensorFlow's BFC allocator (the one trainmem models), got "
                                              "cuda_malloc_async: TensorFlow would allocate from cudaMallocAsync"),
    ("TF_GPU_ALLOCATOR", "memory_guard", "GPUDebugAllocator's guard bytes"),
    ("TF_GPU_ALLOCATOR", "cuda_malloc_asycn", "expected one of TensorFlow's values (cuda_malloc_async, cuda_malloc, "
                                              "memory_guard) or none, got 'cuda_malloc_asycn'"),
])
def test_bad_tensorflow_settings_are_one_line_naming_the_variable(monkeypatch, capsys, name, value, says):
    monkeypatch.setenv(name, value)
    code = main(KERAS_GPU)
    captured = capsys.readouterr()
    _one_line_exit_2(code, captured.out, captured.err, f"trainmem: error: {name} in the environment: ", says)


def test_the_allocator_is_refused_even_with_tf_memory_given(monkeypatch):
    monkeypatch.setenv("TF_GPU_ALLOCATOR", "cuda_malloc")
    with pytest.raises(TrainmemError, match="TF_GPU_ALLOCATOR in the environment"):
        with_environment(_options(framework="keras", tf_memory="growth"))


def test_compare_reads_them_for_its_keras_side(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    assert with_environment(_options(), "compare").tf_memory == "growth"


@pytest.mark.heavy  # a PyTorch estimate on a GPU: about 3 s here
def test_a_pytorch_estimate_on_a_gpu_ignores_them(monkeypatch, capsys):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "garbage")
    monkeypatch.setenv("TF_GPU_ALLOCATOR", "garbage")
    code = main(["estimate", "mlp:256-256-10", "--input-shape", "256", "--batch-size", "8", "--device", "a100-40gb",
                 "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0 and "TF_" not in captured.err, captured.err


@pytest.mark.tf
def test_the_keras_report_states_the_mode_the_environment_gave(monkeypatch, capsys):
    pytest.importorskip("keras")
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # PyTorch's: not read for Keras
    code = main(KERAS_GPU)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["keras"]["tensorflow"]["memory_mode"] == "growth"
    assert ("TensorFlow GPU memory mode 'growth' from TF_FORCE_GPU_ALLOW_GROWTH=true in the environment "
            "(--tf-memory overrides it)") in captured.err
    assert "PYTORCH_CUDA_ALLOC_CONF" not in captured.err


# ---- quiet by default: TensorFlow's start-up lines, the Hugging Face libraries' warnings ----

ONEDNN = ("I0000 00:00:1796493278.425164    7310 port.cc:153] oneDNN custom operations are on. You may see slightly "
          "different numerical results.\n")
NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
GUARD = ("I0000 00:00:1796493278.514880    7310 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n"
         "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild TensorFlow.\n")
WARN = "W0000 00:00:1796493278.514880    7310 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n"
ERROR = "E0000 00:00:1796493278.514880    7310 cuda_dnn.cc:8310] Unable to register cuDNN factory.\n"
PYTHON_WARNING = "/x/tensorflow/__init__.py:3: UserWarning: a real warning\n  warnings.warn('a real warning')\n"


def test_start_up_lines_below_the_level_are_dropped_and_the_rest_kept():
    text = NOTICE + ONEDNN + GUARD + WARN + ERROR + PYTHON_WARNING + NOTICE + ONEDNN
    assert kept_lines(text, 2) == ERROR + PYTHON_WARNING
    assert kept_lines(text, 1) == WARN + ERROR + PYTHON_WARNING
    assert kept_lines(text, 0) == text
    assert kept_lines("plain text\n", 3) == "plain text\n"


FAKE_TENSORFLOW = """\
import os, warnings
os.write(2, {lines!r}.encode())
warnings.warn("a real warning")
os.write(2, ("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", "unset") + "\\n").encode())
"""


@pytest.mark.parametrize("debug", [False, True])
def test_the_first_import_of_tensorflow_is_filtered_unless_debug(tmp_path, debug):
    """The mechanism without TensorFlow: a stand-in `tensorflow` package that writes absl records to descriptor
    2 at import, as TensorFlow's shared libraries do."""
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_TENSORFLOW.format(lines=NOTICE + ONEDNN + ERROR))
    code = textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        from trainmem.cli.quiet import libraries_quiet
        with libraries_quiet({debug}):
            import tensorflow
        print(tensorflow.__loader__.__class__.__name__)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SourceFileLoader"  # the module keeps the loader that loaded it
    assert ERROR in done.stderr and "UserWarning: a real warning" in done.stderr
    if debug:
        assert NOTICE in done.stderr and ONEDNN in done.stderr and "TF_CPP_MIN_LOG_LEVEL=unset" in done.stderr
    else:
        assert "port.cc" not in done.stderr and "absl::InitializeLog" not in done.stderr
        assert "TF_CPP_MIN_LOG_LEVEL=2" in done.stderr


def test_hugging_face_deprecations_are_ignored_unless_debug():
    def shown(debug: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with libraries_quiet(debug):
                for module in ("transformers.modeling_utils", "peft.peft_model", "trainmem.frontends.hf", "user_model"):
                    warnings.warn_explicit(f"from {module}", FutureWarning, "x.py", 1, module=module)
        return [str(warning.message) for warning in caught]

    assert shown(False) == ["from trainmem.frontends.hf", "from user_model"]
    assert len(shown(True)) == 4


@pytest.mark.tf
@pytest.mark.parametrize("debug", [False, True])
def test_a_keras_answer_has_no_tensorflow_start_up_line(debug):
    pytest.importorskip("keras")
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("TF_CPP", "KERAS_"))}
    done = subprocess.run([sys.executable, "-m", "trainmem", "estimate", "mlp:1000-100-10", "--framework", "keras",
                           "--input-shape", "1000", "--batch-size", "32", *(["--debug"] if debug else [])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=environment)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    start_up = [line for line in done.stderr.splitlines() if ABSL_RECORD.match(line) or "absl::" in line]
    if not debug:  # with --debug TensorFlow's lines are allowed (this build prints them as its libraries load)
        assert start_up == [], done.stderr
