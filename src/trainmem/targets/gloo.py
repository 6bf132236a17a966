"""What gloo's collectives allocate on the CPU below the dispatcher, as kernel rules keyed on the c10d op
names the recorder sees (`KernelCall.op`, the op's overload packet name).

Each rule is the measurement of benchmarks/gloo_temporaries.py (results/gloo_temporaries.md: a real run of
2 and 4 processes, float32 input of 4 MiB, c10's allocation log on every thread) and the code in
torch/csrc/distributed/c10d/ProcessGroupGloo.cpp that explains it (pytorch/pytorch, read at c194358a):

- all-gather (`_allgather_base_`, `allgather_`): AsyncAllgatherWork::allgather runs gloo into
  `flatOutputTensor = newLikeFlat(outputs[0])`, one buffer as large as the whole output, then copies each
  rank's slice out (`outputgroup[j].copy_(flatOutputTensor[j])`); the buffer is a local of the work's run(),
  made and freed on gloo's worker thread before the work completes. Torch 2.13 also makes and frees an
  output-sized empty on the calling thread first (measured; the two never overlap). Transient: one output.
- reduce-scatter (`_reduce_scatter_base_`, `reduce_scatter_tensor_coalesced_`): reduce_scatter_tensor_coalesced
  does `buffers.push_back(inputTensors[i].clone())`, all-reduces the clone and copies this rank's chunk out;
  the clone lives while the work object holds it. Transient: one input. The work is held by the caller's
  LambdaWork and by the worker thread until it finishes its loop iteration (ProcessGroupGloo::runLoop); on a
  loaded machine the worker can drop it after the caller has moved on, which keeps the clone alive a few
  allocations longer (measured on this 2-core machine, FSDP2 over 2 ranks: +0.44 MiB on some runs). That
  scheduling is not modelled: the clone is freed when the call returns.
- all-reduce (`allreduce_`), broadcast (`broadcast_`): in place on the given tensors (AsyncAllreduceWork sets
  them as gloo's outputs; AsyncBroadcastWork likewise): nothing. ReduceOp.AVG divides in place afterwards,
  `tensors[0] /= context_->size`, which wraps the size in an 8-byte scalar and a 4-byte cast (12 B measured,
  128 B with the allocator's rounding): below what the rules size, left out.
"""

from __future__ import annotations

from trainmem.targets import KernelEffect
from trainmem.trace.events import KernelCall, TensorMeta

GLOO_OPS: frozenset[str] = frozenset({"_allgather_base_", "allgather_", "_reduce_scatter_base_",
                                      "reduce_scatter_tensor_coalesced_", "allreduce_", "broadcast_"})


def _nbytes(meta) -> int:
    """A TensorMeta's bytes; a tensor's too (the recorder keeps a list of lists, allgather_'s outputs, as
    the tensors themselves)."""
    if isinstance(meta, TensorMeta):
        shape, itemsize = meta.shape, meta.itemsize
    elif hasattr(meta, "shape") and hasattr(meta, "element_size"):
        shape, itemsize = tuple(meta.shape), meta.element_size()
    else:
        return 0
    count = 1
    for size in shape:
        count *= size
    return count * itemsize


def _flat(values) -> list:
    """The tensors of an argument that is a tensor, a list of tensors or a list of lists."""
    if isinstance(values, TensorMeta) or hasattr(values, "element_size"):
        return [values]
    out = []
    for value in values if isinstance(values, (list, tuple)) else ():
        out.extend(_flat(value))
    return out


def _transient(nbytes: int, rule: str) -> list[KernelEffect]:
    return [KernelEffect(before=(nbytes,), after=(-nbytes,), rule=rule)] if nbytes else []


def gloo_effects(call: KernelCall) -> list[KernelEffect]:
    """What one c10d call does on the CPU below the dispatcher under ProcessGroupGloo (see the module's
    docstring); [] for an op gloo runs in place or one not in GLOO_OPS."""
    if call.op not in GLOO_OPS or not call.args:
        return []
    if call.op == "_allgather_base_":  # (output_tensor, input_tensor, …)
        return _transient(_nbytes(call.args[0]), "gloo all-gather flat output buffer")
    if call.op == "allgather_":  # (output_tensors[][], input_tensors[], …): one flat buffer per output group
        groups = call.args[0] if isinstance(call.args[0], (list, tuple)) else ()
        return [effect for group in groups
                for effect in _transient(sum(_nbytes(t) for t in _flat(group)), "gloo all-gather flat output buffer")]
    if call.op == "_reduce_scatter_base_":  # (output_tensor, input_tensor, …)
        return _transient(_nbytes(call.args[1]), "gloo reduce-scatter input copy")
    if call.op == "reduce_scatter_tensor_coalesced_":  # (outputs[], inputs[], …): a clone of every input, all live
        clones = [_nbytes(t) for t in _flat(call.args[1])]
        total = sum(clones)
        return [KernelEffect(before=tuple(clones), after=(-total,), rule="gloo reduce-scatter input copy")] if total else []
    return []
