"""Every tensor's lifetime in one or more runs of a TensorFlow step graph, as the executor holds them.

The executor (tensorflow/core/common_runtime/executor.cc) keeps one reference to an op's output per
consumer: PropagateOutputs copies the output into each consumer's input slot, and after a consumer's
kernel ran, ClearInputs drops its slots. An output no op consumes is dropped when the op's outputs are
propagated. A buffer is freed when its last reference goes: the consumers' slots, the tensors that alias
it (Identity, Reshape… trace/tf/kernels.py) and a variable that holds it. So here a buffer's reference count is
the sum of the remaining consumer slots of the live values on it, plus one per variable holding it;
kernels that forward (trace/tf/kernels.py) reuse an input's buffer when that count is exactly one: their own slot.

Order: the ops run in the order given (StepGraph.ops; trace/tf/keras_graph.py says which order that is);
within an op the outputs are allocated before its inputs are released.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque

from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace
from trainmem.trace.tf.kernels import ALL, KERNEL_ATTRS, KERNEL_OPS, Rule, rule_for
from trainmem.trace.tf.ops import GraphOp, StepGraph, TensorInfo, ValueRef

_PROVISIONAL = {Phase.INPUTS: Category.INPUTS, Phase.FORWARD: Category.ACTIVATIONS, Phase.LOSS: Category.ACTIVATIONS,
                Phase.BACKWARD: Category.TEMPORARIES, Phase.OPTIMIZER: Category.TEMPORARIES}


@dataclasses.dataclass
class _Buffer:
    sid: int
    values: set = dataclasses.field(default_factory=set)  # live values (ValueRef, step) on it
    variables: set = dataclasses.field(default_factory=set)  # variables holding it


@dataclasses.dataclass
class Replay:
    trace: Trace
    unsupported: Counter  # op types without a rule
    unknown_sizes: Counter  # op types with an output of unknown size (counted as 0 bytes)
    backward_start: dict[int, int]  # step -> seq of the first backward event
    copy_on_write: int = 0  # variable copies made because a read still held the buffer


class _Replayer:
    def __init__(self, graph: StepGraph) -> None:
        self.graph = graph
        self.trace = Trace()
        self.unsupported: Counter = Counter()
        self.unknown: Counter = Counter()
        self.buffers: dict[int, _Buffer] = {}  # sid -> buffer
        self.value_sid: dict[ValueRef, int] = {}
        self.remaining: Counter = Counter()  # consumer slots left per value
        self.var_sid: dict[str, int] = {}
        self.copy_on_read: set[str] = set()
        self.uses = Counter(ref for op in graph.ops for ref in op.inputs)
        self.producers = {op.name: op for op in graph.ops}
        self.phase, self.step, self.module, self.op = Phase.INIT, 0, "", ""
        self.backward_start: dict[int, int] = {}
        # backward starts with the first gradient op fed by the loss: ops the tape names gradient_tape/
        # but the forward loop needs (while_v2's accumulator lists) may run earlier
        self.from_loss: set[str] = set()
        for op in graph.ops:
            if op.phase == Phase.LOSS or any(ref[0] in self.from_loss for ref in op.inputs):
                self.from_loss.add(op.name)
        self.copy_on_write = 0
        self.consumers: dict[ValueRef, set[str]] = {}
        for op in graph.ops:
            for ref in op.inputs:
                self.consumers.setdefault(ref, set()).add(op.name)
        self.ancestors = _ancestors(graph.ops)
        self.index = {op.name: i for i, op in enumerate(graph.ops)}

    # ---- events ---------------------------------------------------------------------------
    def _alloc(self, nbytes: int, category: Category, info: TensorInfo | None = None, module: str | None = None) -> int:
        sid = len(self.trace.storages)
        record = StorageRecord(sid, nbytes, category, self.phase, self.module if module is None else module, self.op,
                               self.step, info.dtype if info else "", tuple(info.shape or ()) if info else ())
        self.trace.storages[sid] = record
        self.buffers[sid] = _Buffer(sid)
        self._emit("alloc", record)
        if info is not None and info.dtype == "int32":
            # int32 tensors live in host memory on a GPU: TensorFlow registers its GPU kernels' int32
            # inputs and outputs HostMemory (e.g. cwise_op_add_1.cc), the device holds none of them
            self.trace.host_storages.add(sid)
        return sid

    def _emit(self, action: str, record: StorageRecord) -> None:
        events = self.trace.events
        events.append(Event(len(events), action, record.nbytes, record.sid, self.phase, self.module, self.op, self.step))

    def _release_if_dead(self, sid: int) -> None:
        buffer = self.buffers.get(sid)
        if buffer is not None and not buffer.values and not buffer.variables:
            del self.buffers[sid]
            self._emit("free", self.trace.storages[sid])

    def refcount(self, sid: int) -> int:
        buffer = self.buffers[sid]
        return sum(self.remaining[ref] for ref, _ in buffer.values) + len(buffer.variables)

    # ---- values -----------------------------------------------------------------------------
    def _bind(self, ref: ValueRef, sid: int) -> None:
        self.value_sid[ref] = sid
        self.remaining[ref] = self.uses[ref]
        self.buffers[sid].values.add((ref, self.step))

    def _consume(self, ref: ValueRef) -> None:
        if ref not in self.value_sid:
            return
        self.remaining[ref] -= 1
        if self.remaining[ref] <= 0:
            self._drop(ref)

    def _drop(self, ref: ValueRef) -> None:
        sid = self.value_sid.pop(ref)
        self.buffers[sid].values.discard((ref, self.step))
        self._release_if_dead(sid)

    # ---- set-up -----------------------------------------------------------------------------
    def start(self) -> None:
        self.phase = Phase.INIT
        for name, var in self.graph.variables.items():
            self.module, self.op = var.module, "VarHandleOp"
            sid = self._alloc(var.nbytes, var.category, TensorInfo(var.shape, var.dtype))
            self.buffers[sid].variables.add(name)
            self.var_sid[name] = sid
        for name, info in self.graph.constants.items():
            # a Const kernel's tensor is built once and kept with the kernel (constant_op.cc)
            self.module, self.op = "", "Const"
            sid = self._alloc(info.nbytes, Category.RUNTIME, info)
            self.buffers[sid].variables.add(name)
            self.var_sid[name] = sid

    def run_step(self, step: int) -> None:
        self.step = step
        self.phase, self.module, self.op = Phase.INPUTS, "", "IteratorGetNext"
        for name, info in self.graph.inputs.items():  # the batch fit's iterator hands the step
            self._bind((name, 0), self._alloc(info.nbytes, Category.INPUTS, info))
        for op in self.graph.ops:
            self.phase, self.module, self.op = op.phase, op.module, op.type
            if op.phase == Phase.BACKWARD and step not in self.backward_start and op.name in self.from_loss:
                self.backward_start[step] = len(self.trace.events)
            self._run(op)
        for ref in list(self.value_sid):
            self._drop(ref)  # values alive at the step's end (fetched outputs): the function returns them

    def _run(self, op: GraphOp) -> None:
        rule = rule_for(op.type)
        if rule is None:
            if not op.output_bytes:  # a rule sized it (trace/tf/while_loops.py) or nothing knows it
                self.unsupported[op.type] += 1
            rule = Rule("allocate")
        at_seq, first_sid = len(self.trace.events), len(self.trace.storages)
        sids = self._outputs(op, rule)
        if op.type in KERNEL_OPS:
            self._kernel_call(op, at_seq, [s if s is not None and s >= first_sid else None for s in sids])
        bound = []
        for index, sid in enumerate(sids):  # outputs take their buffers before the inputs let theirs go
            ref = (op.name, index)
            if sid is not None and sid in self.buffers:
                self._bind(ref, sid)
                bound.append(ref)
                if ref in self.graph.gradients and not self.buffers[sid].variables:
                    self.trace.storages[sid].category = Category.GRADIENTS
        for ref in op.inputs:
            self._consume(ref)
        for ref in bound:
            if self.remaining[ref] == 0 and ref in self.value_sid:
                self._drop(ref)  # an output no op consumes: dropped when the outputs are propagated

    def _outputs(self, op: GraphOp, rule: Rule) -> list[int | None]:
        """The buffer of each output (None: no buffer, a handle or a write); allocations are emitted here."""
        kind = rule.kind
        if kind == "input":
            return [self._alloc(op.outputs[0].nbytes, Category.INPUTS, op.outputs[0])]
        if kind in ("handle", "none") or not op.outputs and kind not in ("assign", "update"):
            return [None] * len(op.outputs)
        if kind == "const":
            return [self.var_sid.get(op.name)]
        if kind == "read":
            return [self._read(op)]
        if kind in ("assign", "update"):
            self._write(op, adopt=kind == "assign")
            return [None] * len(op.outputs)
        if kind == "alias" or (op.type == "Cast" and self._same_dtype(op)) or (op.type == "BroadcastTo" and self._same_shape(op)):
            return self._aliases(op)
        scratch = self._alloc(op.scratch_bytes, Category.TEMPORARIES) if op.scratch_bytes else None
        sids: list[int | None] = []
        for index, info in enumerate(op.outputs):
            forwarded = self._forwardable(op, rule, info) if index == 0 and kind == "forward" else None
            sized = op.output_bytes[index] if index < len(op.output_bytes) else None
            sids.append(forwarded if forwarded is not None else self._alloc_output(op, info, sized))
        if scratch is not None:
            self._release_if_dead(scratch)
        return sids

    def _alloc_output(self, op: GraphOp, info: TensorInfo, sized: int | None = None) -> int | None:
        if info.dtype in ("resource",):
            return None
        if sized is None and (not info.known or info.dtype == "variant"):
            self.unknown[op.type] += 1
        nbytes = sized if sized is not None else info.nbytes
        return self._alloc(nbytes, _PROVISIONAL.get(self.phase, Category.TEMPORARIES), info)

    def _input_sid(self, op: GraphOp, index: int) -> int | None:
        if index >= len(op.inputs):
            return None
        ref = op.inputs[index]
        return self.value_sid.get(ref, self.var_sid.get(ref[0]))

    def _aliases(self, op: GraphOp) -> list[int | None]:
        """Output i shares input i's buffer (IdentityN), or input 0's (Identity, Reshape, ExpandDims…)."""
        if op.type == "IdentityN":
            return [self._input_sid(op, i) for i in range(len(op.outputs))]
        return [self._input_sid(op, 0)] + [None] * (len(op.outputs) - 1)

    def _same_dtype(self, op: GraphOp) -> bool:
        producer = self._input_info(op, 0)
        return producer is not None and producer.dtype == op.outputs[0].dtype

    def _same_shape(self, op: GraphOp) -> bool:
        producer = self._input_info(op, 0)
        return producer is not None and producer.known and producer.shape == op.outputs[0].shape

    def _input_info(self, op: GraphOp, index: int) -> TensorInfo | None:
        name, out = op.inputs[index]
        producer = self.producers.get(name)
        if producer is not None:
            return producer.outputs[out]
        return self.graph.inputs.get(name, self.graph.constants.get(name))

    def _forwardable(self, op: GraphOp, rule: Rule, info: TensorInfo) -> int | None:
        """The input buffer this op's output 0 takes over (op_kernel.cc forward_input), or None."""
        candidates = range(len(op.inputs)) if rule.candidates == (ALL,) else rule.candidates
        for index in candidates:
            sid = self._input_sid(op, index)
            source = self._input_info(op, index) if index < len(op.inputs) else None
            if sid is None or source is None or sid not in self.buffers:
                continue
            if source.dtype != info.dtype or not source.known or not info.known or source.nbytes != info.nbytes:
                continue
            if self.buffers[sid].variables or self.refcount(sid) != 1 or not self._ordered_before(op, sid):
                continue
            return sid
        return None

    def _ordered_before(self, op: GraphOp, sid: int) -> bool:
        """Whether every other consumer of the buffer's values must run before `op`: its ancestors in the
        graph. The executor runs an op once its inputs are ready (executor.cc ExecutorState::ScheduleReady,
        inter-op threads), so two consumers of one tensor that no edge orders may run either way round; if
        the other runs later, the buffer still has two references when `op` asks to forward it
        (op_kernel.cc forward_input: RefCountIsOne) and `op` allocates. Measured (RunMetadata, FULL_TRACE,
        TF_CPU_ALLOCATOR_USE_BFC): embedding_bag's Adam Square of the IndexedSlices values ran before the
        UnsortedSegmentSum that densifies the same values and allocated 104,857,600 B at batch 2048."""
        mine = self.ancestors.get(op.name, 0)
        index = self.index
        for ref, _ in self.buffers[sid].values:
            for name in self.consumers.get(ref, ()):
                if name != op.name and name in index and not mine >> index[name] & 1:
                    return False
        return True

    # ---- variables --------------------------------------------------------------------------
    def _read(self, op: GraphOp) -> int | None:
        var = op.inputs[0][0]
        if var not in self.var_sid:
            return self._alloc_output(op, op.outputs[0])
        if var in self.copy_on_read:  # ReadVariableOp copies a variable in copy-on-read mode
            return self._alloc(op.outputs[0].nbytes, Category.TEMPORARIES, op.outputs[0])
        return self.var_sid[var]

    def _write(self, op: GraphOp, adopt: bool) -> None:
        var = op.inputs[0][0]
        if var not in self.var_sid:
            return
        old = self.var_sid[var]
        if adopt and len(op.inputs) > 1 and op.inputs[1] in self.value_sid and var not in self.copy_on_read:
            new = self.value_sid[op.inputs[1]]  # AssignVariableOp: the variable takes the value's buffer
            self.trace.storages[new].category = self.trace.storages[old].category
            self.trace.storages[new].module = self.trace.storages[old].module
        elif not adopt and self.refcount(old) > 1:
            record = self.trace.storages[old]  # copy-on-write: a read still holds the variable's buffer
            new = self._alloc(record.nbytes, record.category, TensorInfo(record.shape, record.dtype), record.module)
            self.copy_on_write += 1
        else:
            return
        self.buffers[new].variables.add(var)
        self.var_sid[var] = new
        self.buffers[old].variables.discard(var)
        self._release_if_dead(old)

    def _kernel_call(self, op: GraphOp, at_seq: int, sids: list[int | None]) -> None:
        metas = []
        for index in range(len(op.inputs)):
            info = self._input_info(op, index)
            metas.append(_meta(info, self._input_sid(op, index)) if info is not None else None)
        attrs = {k: v for k, v in op.attrs if k in KERNEL_ATTRS}
        allocated = len(self.trace.events) - at_seq
        outputs = tuple(_meta(info, sid) for info, sid in zip(op.outputs, sids))
        self.trace.kernel_calls.append(KernelCall(op.type, at_seq, allocated, (*metas, attrs), outputs, tuple(sids)))


def _ancestors(ops: list[GraphOp]) -> dict[str, int]:
    """Each op's ancestors (data and control edges) as a bit set over the ops' positions; ops are in a
    topological order."""
    index = {op.name: i for i, op in enumerate(ops)}
    found: dict[str, int] = {}
    for op in ops:
        bits = 0
        for name in {ref[0] for ref in op.inputs} | set(op.control_inputs):
            if name in index:
                bits |= found.get(name, 0) | (1 << index[name])
        found[op.name] = bits
    return found


def _meta(info: TensorInfo, sid: int | None) -> TensorMeta:
    shape = tuple(d if d is not None else -1 for d in (info.shape or ()))
    return TensorMeta(shape, info.itemsize, info.dtype, True, sid if sid is not None else -1)


def replay(graph: StepGraph, steps: int = 1) -> Replay:
    """Run the step graph `steps` times over persistent variables and constants."""
    replayer = _Replayer(graph)
    replayer.start()
    for step in range(steps):
        replayer.run_step(step)
    result = Replay(replayer.trace, replayer.unsupported, replayer.unknown, replayer.backward_start,
                    replayer.copy_on_write)
    settle_forward(result)
    return result


def ready_order(ops: list[GraphOp], resources: set[str] | frozenset = frozenset()) -> list[GraphOp]:
    """The ops as an executor that runs every op as soon as its inputs are ready would run them, first
    ready first (executor.cc ExecutorState::ScheduleReady / the ready queue of one inter-op thread): variable
    reads and ops on the previous step's optimizer slots at the start, both branches of a split in turns.
    Measured here against TensorFlow's allocation records (benchmarks/results/tf_tensor_peak.md): the real
    embedding_bag step densified both Adam moments of the IndexedSlices gradient while its values were alive,
    which this order replays and the creation order does not. The ops that touch one of `resources`
    (variable handles) keep their program order as fit's tf.function adds it (auto_control_deps.py: a read
    waits for the last write, a write for the last write and the reads since); the step's tf.Graph lacks
    those control edges."""
    index = {op.name: i for i, op in enumerate(ops)}
    after = _resource_order(ops, resources)
    waiting, consumers = {}, {}
    for op in ops:
        producers = ({ref[0] for ref in op.inputs if ref[0] in index} | {n for n in op.control_inputs if n in index}
                     | after.get(op.name, set()))
        waiting[op.name] = len(producers)
        for name in producers:
            consumers.setdefault(name, []).append(op)
    queue = deque(op for op in ops if waiting[op.name] == 0)
    order = []
    while queue:
        op = queue.popleft()
        order.append(op)
        for consumer in consumers.get(op.name, ()):
            waiting[consumer.name] -= 1
            if waiting[consumer.name] == 0:
                queue.append(consumer)
    return order if len(order) == len(ops) else list(ops)


def _resource_order(ops: list[GraphOp], resources: set[str] | frozenset) -> dict[str, set[str]]:
    """Per op, the earlier ops on the same variable it must follow (auto_control_deps.py, program order)."""
    last_write: dict[str, str] = {}
    reads: dict[str, list[str]] = {}
    after: dict[str, set[str]] = {}
    for op in ops:
        for var in {ref[0] for ref in op.inputs if ref[0] in resources}:
            before = {last_write[var]} if var in last_write else set()
            if rule_for(op.type) is not None and rule_for(op.type).kind == "read":
                reads.setdefault(var, []).append(op.name)
            else:
                before |= set(reads.pop(var, []))
                last_write[var] = op.name
            after.setdefault(op.name, set()).update(before - {op.name})
    return after


def tensor_peak(trace: Trace) -> int:
    live = peak = 0
    for event in trace.events:
        live += event.nbytes if event.action == "alloc" else -event.nbytes
        peak = max(peak, live)
    return peak


def live_at(trace: Trace, seq: int) -> set[int]:
    """Storages allocated before event `seq` and not yet freed."""
    live: set[int] = set()
    for event in trace.events[:seq]:
        (live.add if event.action == "alloc" else live.discard)(event.sid)
    return live


def settle_forward(result: Replay) -> None:
    """Forward and loss outputs still alive when the step's first gradient op runs are activations (kept
    for backward); the ones that died before are temporaries."""
    for step, seq in result.backward_start.items():
        alive = live_at(result.trace, seq)
        for record in result.trace.storages.values():
            if record.step == step and record.category == Category.ACTIVATIONS and record.sid not in alive:
                record.category = Category.TEMPORARIES
