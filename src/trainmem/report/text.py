"""The terminal report: peaks, breakdown at the peak, where the peak is, per module, how it adds up."""

from __future__ import annotations

from trainmem.device_catalog import CAPACITY_FROM_DATASHEET
from trainmem.estimate.result import module_label, step_label
from trainmem.units import format_bytes


def _table(rows: list[list[str]], align: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _quantized(est) -> str:
    if not est.quantized_parameters:
        return ""
    return (f"; {est.quantized_parameters:,} of the model's in 4-bit NF4, stored in "
            f"{format_bytes(est.quantized_storage_bytes)} with their statistics")


def _used(est) -> list[str]:
    """What the trace used where the setup left it open: the batch, the loss, a frontend's choices, LoRA."""
    used = est.resolved
    if not used:
        return []
    inputs = used["inputs"]
    parts = [f"task {used['task']}"] if "task" in used else []
    if "seq_len" in used:
        parts.append(f"sequence length {used['seq_len']} ({used.get('seq_len_from', '')})".replace(" ()", ""))
    parts.append("inputs " + ", ".join(f"{'' if t['name'].isdigit() else t['name'] + ' '}{t['shape']} {t['dtype']}"
                                       for t in inputs["tensors"]) + f" ({inputs['from']})")
    parts.append(f"loss {used['loss']['loss']} ({used['loss']['from']})")
    lines = ["  " + " · ".join(parts)]
    lora = used.get("lora")
    if lora:
        targets = ", ".join(lora["targets"]) if isinstance(lora["targets"], list) else lora["targets"]
        lines.append(f"  LoRA r={lora['r']}, alpha={lora['alpha']}, dropout {lora['dropout']} on {targets} "
                     f"({lora['adapted_layers']} layers)")
    return lines


LOOP_WORDS = {  # trace/loops.py has the code each loop stands for
    "inline": "PyTorch's tutorial loop; inputs, outputs and loss stay bound until the next iteration rebinds them",
    "step-fn": "a train_step() function; outputs and loss die when it returns, the batch when the next replaces it",
    "trainer": "Hugging Face Trainer / Lightning; outputs dropped before backward, the batch kept through the step",
    "lean": "outputs deleted before backward, the batch and loss right after it",
}


def _loop_line(est) -> str:
    """The training loop the estimate traced: PyTorch's loop by --loop, or, for a Keras model, the loop its
    frontend resolved (frontends/keras_torch.py: model.fit's, which --loop does not change)."""
    resolved = getattr(est, "resolved", None) or {}
    if resolved.get("framework") == "keras" and resolved.get("loop"):
        return f"  loop: {resolved['loop']}"
    return f"  loop {est.setup.loop}: {LOOP_WORDS[str(est.setup.loop)]}"


def _lean_loop(est) -> list[str]:
    lean = est.lean_loop
    if not lean or lean.saving_bytes <= 0:
        return []
    return [f"  The loop's references cost {format_bytes(lean.saving_bytes)} here: `del outputs` before backward and "
            f"`del loss, inputs` after it (--loop lean) would peak at {format_bytes(lean.allocated_bytes)}."]


def _capacity_note(est) -> str:
    """A capacity taken from a datasheet rather than measured says so (device_catalog.py: H200, GB200)."""
    gpu = est.device.gpu
    if gpu is None or gpu.capacity_from != CAPACITY_FROM_DATASHEET:
        return ""
    return f" ({format_bytes(est.device.capacity_bytes)}: the datasheet's figure, not a measured total)"


def render_text(est) -> str:
    s = est.setup
    impl = est.resolved.get("optimizer_impl")
    if impl and str(s.optimizer_impl) == "default":
        impl = "its own implementation" if impl.endswith("own") else f"default: {impl}"
    else:
        impl = s.optimizer_impl
    adapters = f" + {est.adapter_parameters:,} in LoRA adapters" if est.adapter_parameters else ""
    out = [f"trainmem — {est.model_name}: {est.parameters:,} parameters{adapters} ({est.trainable_parameters:,} "
           f"trainable{_quantized(est)})",
           f"  batch {s.batch_size} · {s.optimizer} ({impl}) · {s.precision}"
           + (f" · grad-accum {s.grad_accum}" if s.grad_accum > 1 else "")
           + (" · checkpointing" if s.checkpointing else "") + f" · device {est.device.name}{_capacity_note(est)}",
           *_used(est),
           _loop_line(est), ""]
    out.append("Peak memory")
    verdict = f"of {format_bytes(est.device.capacity_bytes)}: " + ("fits" if est.fits else "DOES NOT FIT")
    if est.device.kind == "cuda":
        out += _table([
            ["tensors (live storage)", format_bytes(est.tensor_bytes), f"{est.tensor_bytes:,} B as requested"],
            ["allocated", format_bytes(est.allocated_bytes), f"{est.allocated_bytes:,} B  torch.cuda.max_memory_allocated()"],
            ["reserved", format_bytes(est.reserved_bytes), f"{est.reserved_bytes:,} B  torch.cuda.max_memory_reserved()"],
            ["process (nvidia-smi)", format_bytes(est.process_bytes), verdict],
        ], "lrl")
    else:
        out += _table([
            ["tensors (live storage)", format_bytes(est.tensor_bytes), f"{est.tensor_bytes:,} B"],
            ["allocated", format_bytes(est.allocated_bytes), "= tensors on the CPU"],
            ["reserved", format_bytes(est.reserved_bytes), "the CPU allocator caches nothing"],
            ["process (peak RSS)", format_bytes(est.process_bytes), verdict],
        ], "lrl")
    if est.process_bytes_high > est.process_bytes:
        out += _table([["process, high end", format_bytes(est.process_bytes_high),
                        "the upper end of what real runs show (peak.process_bytes_high)"]], "lrl")
    out += _ranks_section(est)
    out += ["", f"Where: {step_label(est.peak_step, s.steps)}, {est.peak_phase}, module "
                f"'{module_label(est.peak_module)}', op {est.peak_op}", *_lean_loop(est), "", "Breakdown at the peak"]
    rows = [[k, format_bytes(v), f"{v:,} B"] for k, v in est.breakdown.items() if v]
    total = est.allocated_bytes if est.device.kind == "cuda" else est.tensor_bytes
    out += _table(rows + [["total", format_bytes(total), f"{total:,} B"]], "lrr")
    out += ["", "Process memory (nvidia-smi)" if est.device.kind == "cuda" else "Process memory (peak RSS)"]
    out += _table([[k, format_bytes(v)] for k, v in est.process_parts.items()], "lr")
    if est.allocator:
        a = est.allocator
        out += ["", "Caching allocator",
                f"  reserved but not allocated: {format_bytes(a.fragmentation_at_allocated_peak)} at the allocated peak, "
                f"{format_bytes(a.fragmentation_at_reserved_peak)} at the reserved peak",
                f"  segments at the allocated peak: {a.segments_at_peak} "
                f"(large {format_bytes(a.large_segment_bytes_at_peak)}, small {format_bytes(a.small_segment_bytes_at_peak)})"]
    out += ["", "Per module"]
    out += _table([["module", "params", "saved activations", "at peak"]] + [
        [m.module, f"{m.parameters:,}", format_bytes(m.activation_bytes), format_bytes(m.bytes_at_peak)]
        for m in est.modules], "lrrr")
    out += ["", "How this adds up (by hand → traced)"]
    for row in est.explanation.rows:
        out.append(f"  {row.what}: {row.formula} = {row.hand_bytes:,} B → traced {row.traced_bytes:,} B")
        if row.note:
            out.append(f"      {row.note}")
    out += [f"  · {note}" for note in est.explanation.differences]
    if est.baselines:
        out += ["", f"Rules of thumb beside this estimate (vs {est.baselines[0].vs})"]
        for row in est.baselines:
            gap = row.relative_to_estimate
            out.append(f"  {row.rule}: {format_bytes(row.bytes)}"
                       + (f" ({gap:+.0%})" if gap is not None else "") + f" — {row.why}")
    if est.warnings:
        out += ["", "Assumptions and warnings"] + [f"  - {w}" for w in est.warnings]
    return "\n".join(out)


def _layout_words(parallel: dict) -> str:
    layout = parallel["layout"]
    degrees = " × ".join(f"{name} {layout[name]}" for name in ("pp", "dp", "tp") if layout[name] > 1) or "1 rank"
    extra = f", offload {layout['offload']}" if layout["offload"] != "none" else ""
    return f"{layout['strategy']}: {layout['world_size']:,} ranks ({degrees}){extra}"


def _ranks_section(est) -> list[str]:
    """Many ranks: one row per distinct rank role, the most loaded marked, the spread between them."""
    parallel = getattr(est, "parallel", None)
    if parallel is None:
        return []
    cuda = est.device.kind == "cuda"
    most = parallel["most_loaded"]["label"]
    host = any(row.host_bytes for row in est.ranks)
    header = ["role", "ranks", "tensors", *(["reserved"] if cuda else []), "process",
              *(["host RAM"] if host else []), ""]
    rows = [header]
    for row in est.ranks:
        peak = row.peak
        rows.append([row.label, f"{len(row.ranks):,}", format_bytes(peak["tensor_bytes"]),
                     *([format_bytes(peak["reserved_bytes"] or 0)] if cuda else []),
                     format_bytes(peak["process_bytes"]),
                     *([format_bytes(row.host_bytes)] if host else []), "◀ most loaded" if row.label == most else ""])
    lines = ["", f"Per rank — {_layout_words(parallel)}"]
    lines += _table(rows, "lr" + "r" * (len(header) - 3) + "l")
    lines.append(f"  spread between roles: {format_bytes(parallel['spread_bytes'])} (process); the figures above "
                 f"this section are the most loaded role's ({most})")
    if host:
        lines.append(f"  host RAM for offloaded tensors: {format_bytes(parallel['host_bytes_per_rank'])} a rank, "
                     f"{format_bytes(parallel['host_bytes_per_node'])} a node of {parallel['layout']['gpus_per_node']}")
    for check in parallel.get("cross_checks", []):
        lines.append(f"  {check['name']}: formula {format_bytes(check['formula_bytes'])} → traced "
                     f"{format_bytes(check['traced_bytes'])}")
        lines.append(f"      {check['explanation']}")
    return lines
