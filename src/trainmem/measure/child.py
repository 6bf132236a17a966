"""One real measurement, run as `python -m trainmem.measure.child '<json request>'` in a fresh
process so that its RSS starts from a clean `import torch`.

mode "rss":     no profiler; peak RSS (VmHWM) after the steps, and RSS after import and after build.
mode "tensors": torch.profiler memory events (they include allocations made inside kernels, below
                the dispatcher); the tensor peak is the running sum of 64-byte-rounded sizes,
                as PyTorch's CPU allocator rounds each request (c10/core/impl/alloc_cpu.cpp).
A request with "keras_backend": "torch" measures a Keras model on the torch backend: the steps are
`model.fit` itself (measure/child.py _fit_keras), not trainmem's loop.
mode "cuda":    the steps on GPU 0 (model, batch and optimizer made under torch.device("cuda"));
                torch.cuda.max_memory_allocated / max_memory_reserved, the process's memory as
                nvidia-smi reports it at the end (the cache is still held), and the GPU, driver,
                CUDA and torch versions (measure/cuda.py).
Prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_now() -> dict[str, int]:
    return {"rss": proc_status_bytes("VmRSS"), "rss_anon": proc_status_bytes("RssAnon"), "rss_file": proc_status_bytes("RssFile")}


def _profile_peak(prof) -> tuple[int, int]:
    from trainmem.trace.torch_private import profiler_memory_events

    events = sorted(profiler_memory_events(prof), key=lambda e: e[0])  # stable: same-ns events keep order
    current = peak = 0
    for _, size in events:
        rounded = (abs(size) + 63) // 64 * 64
        current += rounded if size > 0 else -rounded
        peak = max(peak, current)
    return peak, len(events)


def run(request: dict) -> dict:
    after_import = rss_now()
    if request.get("keras_backend"):  # before torch: Keras takes its backend at its first import
        from trainmem.frontends.keras.imports import import_keras

        import_keras(request["keras_backend"])
    import torch

    after_torch = rss_now()
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.trace import step as training

    setup = TrainingSetup.from_mapping(request["setup"])
    torch.manual_seed(request.get("seed", 0))
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    if request.get("keras_backend") == "torch":
        from trainmem.frontends.keras.torch_backend import resolve_keras_torch

        source = resolve_keras_torch(request["model"], setup)
    else:
        source = resolve(request["model"], setup)
    result = {"mode": request["mode"], "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "rss_before_torch": after_import["rss"],
              "rss_after_torch": after_torch["rss"], "rss_file_after_torch": after_torch["rss_file"]}
    started = time.perf_counter()
    if request["mode"] == "cuda":
        from trainmem.measure.cuda import measure_cuda_steps

        result.update(measure_cuda_steps(lambda: _train(source, setup, training, "cuda")))
    elif request["mode"] == "tensors":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _train(source, setup, training, gc_paused=request.get("gc") != "on")
        result["tensor_peak_bytes"], result["memory_events"] = _profile_peak(prof)
    else:
        prepared = _train(source, setup, training)  # kept alive: RSS after the steps includes the model
        result["rss_after_steps"] = rss_now()
        result["peak_rss_bytes"] = proc_status_bytes("VmHWM")
        result["parameters"] = sum(p.numel() for p in prepared.model.parameters())
    result["seconds"] = time.perf_counter() - started
    return result


def _train(source, setup, training, device_type: str = "cpu", gc_paused: bool = True):
    from trainmem.trace import finetune
    from trainmem.trace.keras_torch_step import is_keras_model

    model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    if is_keras_model(model):
        return _fit_keras(model, source, setup, gc_paused)
    model, _ = finetune.apply(model, setup)
    prepared = training.prepare(model, make_batch, loss_fn, setup, source, device_type)
    training.run_steps(prepared, setup, training.Observer())
    return prepared


class _Fitted:
    def __init__(self, model) -> None:
        self.model = model


def _fit_keras(model, source, setup, gc_paused: bool = True):
    """What a Keras user runs: compile, then model.fit for `steps` batches from a torch DataLoader whose
    dataset makes each batch when asked (as a loader reading from disk does), with no collation copy
    (batch_size=None). Only the data and the compile arguments come from trainmem (keras_torch_step's
    batch maker, optimizer and loss mapping); the step is Keras's TorchTrainer.fit/train_step.

    Each step's batch and outputs are held by reference cycles that Keras's tree utilities make with
    torch.utils._pytree (frontends/keras/torch_backend.py CYCLES_NOTE) until Python's cyclic collector runs, so
    the peak of a few steps depends on where a collection happens to fall. With `gc_paused` (the default;
    request "gc": "on" runs with the collector) none runs during fit, which the trace assumes too."""
    import torch

    from trainmem.trace import keras_torch_step as keras_step

    keras_step.check_setup(setup)
    model.compile(optimizer=keras_step.keras_optimizer(setup), loss=keras_step.keras_loss(setup, source.default_loss))
    make_data = keras_step.batch_maker(model, setup, source)

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            while True:
                yield make_data(setup.batch_size)

    paused = gc_paused and gc.isenabled()
    if paused:
        gc.disable()
    try:
        model.fit(torch.utils.data.DataLoader(Batches(), batch_size=None), steps_per_epoch=setup.steps, epochs=1,
                  shuffle=False, verbose=0)  # a DataLoader is not reshuffled by fit (epoch_iterator.py)
    finally:
        if paused:
            gc.enable()
    return _Fitted(model)


def main() -> None:
    request = json.loads(sys.argv[1])
    try:
        result = run(request)
    except Exception as error:  # noqa: BLE001 - reported to the parent as one JSON line
        result = {"error": f"{type(error).__name__}: {error}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip teardown: nothing after the measurement should touch the figures


if __name__ == "__main__":
    main()
