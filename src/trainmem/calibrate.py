"""`trainmem calibrate`: this machine's CPU process facts, measured once and used by every later estimate.

What it measures, each in fresh processes that train a tiny model for two steps (measure/child.py, the
same child `trainmem measure` runs): the process floor (peak RSS of mlp:8-8-2, less that model's own heap
as the estimate replays it), the increment of each kernel family that maps more code or JIT buffers on
first use (oneDNN convolution and LSTM, CPU flash attention: calibration_models.py), and the increment
of each set of libraries a model reference brings in that is installed here (transformers; peft with
transformers). It records the torch build, the instruction sets and thread count (targets/calibrations.py
machine_of), the runs and the date, and stores the entry in the user's cache directory; an estimate on
this machine under the same torch then uses it and says "calibrated on this machine, DATE".

Where TensorFlow is installed it also measures what `import tensorflow, keras` keeps resident (targets/tf/calibration.py:
the one TensorFlow constant that moves between machines), which Keras estimates here then use.

Not measured here: glibc's small-object table (targets/data/cpu_small_objects.json needs an LD_PRELOAD
malloc log and a compiler: benchmarks/calibrate_small_objects.py) and TensorFlow's other constants (fit's machinery,
the cost per op: benchmarks/calibrate_tf_cpu.py); the bundled ones are used, as the estimate's warnings say.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from trainmem.setup import TrainingSetup

FLOOR_MODEL = "mlp:8-8-2"
MODELS = Path(__file__).with_name("calibration_models.py")
FAMILY_MODELS = {"convolution": "tiny_conv", "lstm": "tiny_lstm", "attention": "tiny_attention"}
# the sets of libraries a reference brings (targets/cpu_runtime.py import sets), measured where installed
IMPORT_SETS = {("transformers",): {}, ("peft", "transformers"): {"lora": "r=4,targets=fc1"}}
HF_CONFIG = {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
             "max_position_embeddings": 32}


@dataclasses.dataclass(frozen=True)
class Calibration:
    entry: dict
    path: Path | None  # where it was stored (None: not stored)
    seconds: float


def _setup(reference: str, extra: dict | None = None) -> TrainingSetup:
    values = {"batch_size": 1, "optimizer": "adam", **(extra or {})}
    if reference.startswith("mlp:"):
        values["input_shape"] = "8"
    if reference.startswith("hf:"):
        values["seq_len"] = 8
    return TrainingSetup.from_mapping(values)


def above_tensors(reference: str, runs: int, extra: dict | None = None) -> tuple[int, list[int]]:
    """Median peak RSS of `runs` fresh processes, less the run's tensors as glibc holds them (the estimate's
    own replay of the same stream, so the floor and the heap model add up without counting twice)."""
    from trainmem.alloc.cpu_heap import replay_resident
    from trainmem.frontends import resolve
    from trainmem.measure.single_process import run_child
    from trainmem.targets import cpu_kernels
    from trainmem.targets.cpu_info import CpuInfo
    from trainmem.trace.run import trace_training

    import warnings

    setup = _setup(reference, extra)
    peaks = [int(run_child(reference, setup, "rss")["peak_rss_bytes"]) for _ in range(runs)]
    with warnings.catch_warnings():  # a library's deprecation notices are not the user's business here
        warnings.simplefilter("ignore")
        traced = trace_training(resolve(reference, setup), setup, cpu_kernels.kernel_ops())
    stream, _ = cpu_kernels.device_stream(traced.trace, CpuInfo.this_machine())
    return int(statistics.median(peaks)) - replay_resident(stream), peaks


def compile_increment(runs: int, say: Callable[[str], None] = lambda line: None) -> dict[str, int]:
    """What torch.compile adds to the floor model's run (--compile, targets/cpu_runtime.py), from pairs of runs, eager
    and compiled, each compiled one cold (an empty Inductor cache directory of its own, as a first run; the C++ builds
    run in child processes, outside the RSS): `compile`, what stays resident after the steps (dynamo's and Inductor's
    modules, their caches, the compiled code), and `compile_transient`, what the compiling held at its peak beyond that
    and gave back. Medians over the pairs; {} where torch.compile cannot run here (no C++ compiler)."""
    import os
    import tempfile

    from trainmem.errors import TrainmemError
    from trainmem.measure.single_process import run_child

    saved, resident, transient = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), [], []
    try:
        for _ in range(runs):
            eager = run_child(FLOOR_MODEL, _setup(FLOOR_MODEL), "rss")
            with tempfile.TemporaryDirectory(prefix="trainmem-inductor-") as cache:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
                compiled = run_child(FLOOR_MODEL, _setup(FLOOR_MODEL, {"compile": True}), "rss")
            stays = compiled["rss_after_steps"]["rss"] - eager["rss_after_steps"]["rss"]
            resident.append(stays)
            transient.append(compiled["peak_rss_bytes"] - eager["peak_rss_bytes"] - stays)
    except TrainmemError as error:
        say(f"compile: not measured ({error})")
        return {}
    finally:
        if saved is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved
    measured = {"compile": max(0, int(statistics.median(resident))),
                "compile_transient": max(0, int(statistics.median(transient)))}
    say(f"compile: +{measured['compile'] / 2**20:.1f} MiB resident, +{measured['compile_transient'] / 2**20:.1f} MiB "
        "more while compiling")
    return measured


def _tiny_hf_config(folder: Path) -> str:
    """A one-layer Llama configuration written to `folder` (nothing downloaded), as an hf: reference."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    return f"hf:{folder}"


def measure(runs: int = 3, libraries: bool = True, say: Callable[[str], None] = lambda line: None) -> dict:
    """This machine's entry: floor, kernel families, installed import sets, machine facts."""
    import tempfile

    import torch

    from trainmem.targets import cpu_runtime
    from trainmem.targets.calibrations import machine_of
    from trainmem.targets.cpu_info import CpuInfo

    floor, peaks = above_tensors(FLOOR_MODEL, runs)
    say(f"process floor {floor / 2**20:.1f} MiB (peak RSS of {len(peaks)} runs: "
        f"{', '.join(f'{p / 2**20:.0f}' for p in peaks)} MiB)")
    families = {}
    for family, factory in FAMILY_MODELS.items():
        families[family] = max(0, above_tensors(f"{MODELS}:{factory}", max(1, runs - 1))[0] - floor)
        say(f"{family}: +{families[family] / 2**20:.1f} MiB")
    families.update(compile_increment(max(1, runs - 1), say))
    import_sets: dict[str, int] = {}
    if libraries:
        with tempfile.TemporaryDirectory() as folder:
            reference = _tiny_hf_config(Path(folder) / "tiny_llama")
            for names, extra in IMPORT_SETS.items():
                if any(importlib.util.find_spec(name) is None for name in names):
                    say(f"libraries {'+'.join(names)}: not installed, not measured")
                    continue
                extra = {"lora": "r=4,targets=q_proj"} if extra else {}
                above, _ = above_tensors(reference, max(1, runs - 2), extra)  # seconds each: the import
                import_sets[cpu_runtime.import_set_key(names)] = max(0, above - floor)
                say(f"libraries {'+'.join(names)}: +{import_sets[cpu_runtime.import_set_key(names)] / 2**20:.1f} MiB")
    single = {}
    if "transformers" in import_sets:
        single["transformers"] = import_sets["transformers"]
        if "peft+transformers" in import_sets:
            single["peft"] = max(0, import_sets["peft+transformers"] - import_sets["transformers"])
    cpu = CpuInfo.this_machine()
    return {"floor_bytes": floor, "families": families, "libraries": single, "import_sets": import_sets,
            "runs": runs, "machine": f"{platform.machine()} {platform.processor() or ''}".strip()
            + f", {platform.python_version()}", "cpu": _cpu_name(), "machine_facts": machine_of(cpu),
            "torch": torch.__version__, "capability": cpu.capability, "threads": cpu.threads,
            "measured": datetime.date.today().isoformat(), "command": "trainmem calibrate"}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def calibrate(runs: int = 3, store: bool = True, libraries: bool = True,
              say: Callable[[str], None] = lambda line: None) -> Calibration:
    """Measure this machine (`measure`) and store the entry (targets/calibrations.py store)."""
    from trainmem.targets import calibrations

    started = time.perf_counter()
    entry = measure(runs, libraries, say)
    path = calibrations.store(entry) if store else None
    if libraries:  # TensorFlow's import floor too, where it is installed (targets/tf/calibration.py)
        from trainmem.targets.tf import calibration as tf_calibration

        tensorflow = tf_calibration.measure(runs)
        if tensorflow is None:
            say("TensorFlow: not installed, not measured")
        else:
            say(f"TensorFlow {tensorflow['tensorflow']} import floor: {tensorflow['import_anon_bytes'] / 2**20:.1f} MiB "
                f"anonymous + {tensorflow['import_file_bytes'] / 2**20:.1f} MiB library pages")
            entry = {**entry, "tensorflow_floor": tensorflow}
            if store:
                tf_calibration.store(tensorflow, calibrations.cache_dir())
    return Calibration(entry, path, time.perf_counter() - started)
