"""One real measurement, run as `python -m trainmem.measure.child '<json request>'` in a fresh
process so that its RSS starts from a clean `import torch`.

mode "rss":     no profiler; peak RSS (VmHWM) after the steps, and RSS after import and after build.
mode "tensors": torch.profiler memory events (they include allocations made inside kernels, below
                the dispatcher); the tensor peak is the running sum of 64-byte-rounded sizes,
                as PyTorch's CPU allocator rounds each request (c10/core/impl/alloc_cpu.cpp).
mode "cuda":    the steps on GPU 0 (model, batch and optimizer made under torch.device("cuda"));
                torch.cuda.max_memory_allocated / max_memory_reserved, the process's memory as
                nvidia-smi reports it at the end (the cache is still held), and the GPU, driver,
                CUDA and torch versions (measure/cuda.py).
Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> dict[str, int]:
    return {"rss": _status_bytes("VmRSS"), "rss_anon": _status_bytes("RssAnon"), "rss_file": _status_bytes("RssFile")}


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
    after_import = _rss_now()
    import torch

    after_torch = _rss_now()
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.trace import step as training

    setup = TrainingSetup.from_mapping(request["setup"])
    torch.manual_seed(request.get("seed", 0))
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
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
            _train(source, setup, training)
        result["tensor_peak_bytes"], result["memory_events"] = _profile_peak(prof)
    else:
        prepared = _train(source, setup, training)  # kept alive: RSS after the steps includes the model
        result["rss_after_steps"] = _rss_now()
        result["peak_rss_bytes"] = _status_bytes("VmHWM")
        result["parameters"] = sum(p.numel() for p in prepared.model.parameters())
    result["seconds"] = time.perf_counter() - started
    return result


def _train(source, setup, training, device_type: str = "cpu"):
    from trainmem.trace import finetune

    model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    model, _ = finetune.apply(model, setup)
    prepared = training.prepare(model, make_batch, loss_fn, setup, source, device_type)
    training.run_steps(prepared, setup, training.Observer())
    return prepared


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
