"""The terminal report: peaks, breakdown at the peak, where the peak is, per module, how it adds up; and the
one-line answer of --quiet. Numbers sit right-aligned in IEC units (units.format_bytes) with their exact bytes
beside them; colour only when the caller asks for it (report/style.py decides when: a terminal, no NO_COLOR)."""

from __future__ import annotations

from trainmem.device_catalog import CAPACITY_FROM_DATASHEET
from trainmem.estimate.result import Estimate, module_label, step_label
from trainmem.report.style import PLAIN, Style, table
from trainmem.targets import words_for
from trainmem.units import format_bytes

def _quantized(est) -> str:
    if not est.quantized_parameters:
        return ""
    return (f"; {est.quantized_parameters:,} of the model's in 4-bit NF4, stored in "
            f"{format_bytes(est.quantized_storage_bytes)} with their statistics")


def _used(est) -> list[str]:
    """What the trace used where the setup left it open: the batch, the loss, a frontend's choices, LoRA."""
    used = est.resolved
    if not used or "inputs" not in used:  # Keras on TensorFlow resolves only its framework and source
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
    "trainer": "Hugging Face Trainer; outputs dropped before backward, the batch kept through the step",
    "lean": "outputs deleted before backward, the batch and loss right after it",
    "lightning": "Lightning's automatic optimization; zero_grad between forward and backward, the batch through the step",
    "lightning-iterable": "Lightning over a loader without a length; as lightning, with the next batch loaded ahead",
}


TRAINER_WORDS = {  # --trainer (setup/trainers.py has each one's source): what it does around the forward
    "plain": "your own loop: autocast, where you use it, around forward and loss",
    "lightning": "lightning.Trainer: its MixedPrecision plugin puts autocast around the whole training_step",
    "fabric": "lightning.Fabric: fabric.setup's forward casts floating inputs to the low dtype, runs the module "
              "under autocast and casts floating outputs to fp32 (a copy of each low-precision one)",
    "accelerate": "accelerate.Accelerator: the prepared forward runs under autocast and gives fp16/bf16 outputs "
                  "back as fp32 copies",
    "hf": "transformers' Trainer (--hf-trainer): Accelerate's prepared forward, fp32 copies of fp16/bf16 outputs",
}


def trainer_line(trainer) -> list[str]:
    """The report's line naming the trainer, when one was given."""
    return [] if trainer is None else [f"  trainer {trainer}: {TRAINER_WORDS[str(trainer)]}"]


def _loop_line(est) -> str:
    """The training loop the estimate traced: the loop its frontend resolved where one did (a Keras model:
    model.fit's, which --loop does not change; trace/keras_torch_step.py), else PyTorch's loop by --loop."""
    resolved = getattr(est, "resolved", None) or {}
    if resolved.get("loop"):
        return f"  loop: {resolved['loop']}"
    return f"  loop {est.setup.loop}: {LOOP_WORDS[str(est.setup.loop)]}"


def lean_loop_note(est) -> list[str]:
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


def _exact(nbytes: int | None) -> str:
    return "" if nbytes is None else f"{nbytes:,} B"


def _bytes_row(label: str, nbytes: int | None, note: str = "") -> list[str]:
    """A figure as the report lists it: label, IEC size (right-aligned), exact bytes (right-aligned), note."""
    return [label, format_bytes(nbytes), _exact(nbytes), note]


def verdict(est) -> tuple[bool, str]:
    """Whether the step fits, in the words the headline and --quiet share: the process figure (nvidia-smi's
    on a GPU, peak RSS on the CPU) against the device's capacity, as Estimate.fits judges it, and a
    simulated caching allocator that ran out of memory (fits_override) fails it even below capacity."""
    capacity, process = est.device.capacity_bytes, est.process_bytes
    if process > capacity:
        return False, f"{format_bytes(process - capacity)} over"
    if not est.fits:
        failed = est.allocator.out_of_memory if est.allocator and est.allocator.out_of_memory else None
        return False, "the simulated allocator runs out of memory" + (f" ({failed})" if failed else "")
    return True, f"{format_bytes(capacity - process)} free"


def _device_words(est) -> str:
    """The device as the one-line answer names it: the GPU's catalog name, or the CPU's RAM."""
    return est.device.name + words_for(est).device_suffix


def render_quiet(est) -> str:
    """--quiet: the one-line answer, e.g. 'peak 3.06 GiB (fits a100-40gb, 36.94 GiB free)'. The figure is the
    process's (nvidia-smi on a GPU, peak RSS on the CPU), the one Estimate.fits compares with the capacity;
    many ranks: the most loaded rank's, 'per rank'. The high end follows where real runs spread above it."""
    fits, words = verdict(est)
    parallel = getattr(est, "parallel", None)
    answer = (f"fits {_device_words(est)}, {words}" if fits else f"does not fit {_device_words(est)}: {words}")
    rank = ""
    if parallel is not None:
        rank = " per rank"
        if len(getattr(est, "ranks", ())) > 1:  # ranks differ: name the most loaded role, whose figure this is
            answer = f"most loaded: {parallel['most_loaded']['label']}; {answer}"
    high = (f"; high end {format_bytes(est.process_bytes_high)}"
            if est.process_bytes_high > est.process_bytes else "")
    extra = est.framework.quiet_note() if est.framework is not None else ""  # e.g. TensorFlow's default grab
    return f"peak {format_bytes(est.process_bytes)}{rank} ({answer}){high}{extra}"


def _optimizer_words(est) -> str:
    s = est.setup
    impl = est.resolved.get("optimizer_impl")
    if impl and str(s.optimizer_impl) == "default":
        return "its own implementation" if impl.endswith("own") else f"default: {impl}"
    return str(s.optimizer_impl)


def report_header(est, style: Style) -> list[str]:
    s = est.setup
    adapters = f" + {est.adapter_parameters:,} in LoRA adapters" if est.adapter_parameters else ""
    return [style.heading(f"trainmem — {est.model_name}") + f": {est.parameters:,} parameters{adapters} "
            f"({est.trainable_parameters:,} trainable{_quantized(est)})",
            f"  batch {s.batch_size} · {s.optimizer} ({_optimizer_words(est)}) · {s.precision}"
            + (f" · grad-accum {s.grad_accum}" if s.grad_accum > 1 else "")
            + (" · checkpointing" if s.checkpointing else "") + f" · device {est.device.name}{_capacity_note(est)}",
            *_used(est), _loop_line(est), *trainer_line(getattr(est.setup, "trainer", None))]



def _peak_section(est, style: Style) -> list[str]:
    """The four peaks (tensors, allocated, reserved, process), the process figure judged against capacity."""
    fits, words = verdict(est)
    judged = f"of {format_bytes(est.device.capacity_bytes)}: " + (
        style.good(f"fits, {words}") if fits else style.bad(f"DOES NOT FIT, {words}"))
    words = words_for(est)
    rows = [_bytes_row("tensors (live storage)", est.tensor_bytes, words.tensors_note),
            _bytes_row("allocated", est.allocated_bytes, words.allocated_note),
            _bytes_row("reserved", est.reserved_bytes, words.reserved_note),
            _bytes_row(f"process ({words.process_counter})", est.process_bytes, judged)]
    rows[-1][1] = style.strong(rows[-1][1])
    if est.process_bytes_high > est.process_bytes:
        rows.append(_bytes_row("process, high end", est.process_bytes_high,
                               "the upper end of what real runs show (peak.process_bytes_high)"))
    return [style.heading("Peak memory"), *table(rows, "lrrl")]


def where_section(est) -> str:
    return (f"{step_label(est.peak_step, est.setup.steps)}, {est.peak_phase}, module "
            f"'{module_label(est.peak_module)}', op {est.peak_op}")


def _breakdown_section(est, style: Style) -> list[str]:
    rows = [_bytes_row(k, v)[:3] for k, v in est.breakdown.items() if v]
    total = getattr(est, words_for(est).breakdown_total)
    lines = [style.heading("Breakdown at the peak"), *table(rows + [_bytes_row("total", total)[:3]], "lrr")]
    return lines + alive_note(est)


# explain.saved_at_backward_start's key for the batch (Category.INPUTS) among the tensors kept for backward
_BATCH = "inputs (the batch)"
# phases of a step that come after its first backward has begun (trace/loops.py: every loop runs the
# optimizer after backward; zero_grad ends the step except in the inline loop, which zeroes before forward)
_AFTER_BACKWARD = {"backward", "optimizer"}


def alive_note(est) -> list[str]:
    """One sentence where the breakdown's activations (alive at the peak) differ from the explanation's
    (what forward saved for backward, alive when the last step's backward begins): which the breakdown counts."""
    saved = est.explanation.saved_activation_bytes - est.explanation.saved_by_op.get(_BATCH, 0)
    alive = est.breakdown.get("activations", 0)
    if saved <= 0 or alive == saved:
        return []
    phase, s = str(est.peak_phase), est.setup
    if format_bytes(alive) == format_bytes(saved):  # equal at the report's precision: say the bytes
        alive_words, saved_words = f"{alive:,} B", f"{saved:,} B"
    else:
        alive_words, saved_words = format_bytes(alive), format_bytes(saved)
    row = " (the activations row below, less the batch)" if any(
        r.what == "activations" for r in est.explanation.rows) else ""
    head = f"  The breakdown counts what is alive at the peak ({phase}, op {est.peak_op}): "
    if alive > saved:
        return [f"{head}{alive_words} of activations, more than the {saved_words} forward saves for "
                f"backward{row}: the extra is made after backward begins (recomputed under checkpointing, another "
                "micro-batch's forward) or held from the step before."]
    if phase in _AFTER_BACKWARD or (phase == "zero_grad" and str(s.loop) != "inline"):
        return [f"{head}{alive_words} of the {saved_words} of activations forward saves for "
                f"backward{row}; the other {format_bytes(saved - alive)} was freed before it."]
    words = f"{head}{alive_words} of activations, where forward saves {saved_words} for backward{row}"
    if s.grad_accum > 1 and phase in ("forward", "loss"):
        return [f"{words}; the peak falls in a micro-batch's {phase}: before its forward has saved them all, "
                "or after an earlier micro-batch's were freed."]
    if phase in ("forward", "loss"):
        return [f"{words}; the peak comes before forward and the loss have saved them all."]
    return [f"{words}; the peak comes before this step's forward saves them"
            + (": those alive are the previous step's, still referenced." if alive else ".")]


def _process_section(est, style: Style) -> list[str]:
    title = f"Process memory ({words_for(est).process_counter})"
    return [style.heading(title), *table([_bytes_row(k, v)[:3] for k, v in est.process_parts.items()], "lrr")]


def _allocator_section(est, style: Style) -> list[str]:
    a = est.allocator
    if not a:
        return []
    return ["", style.heading("Caching allocator"), *table([
        ["reserved but not allocated at the allocated peak", format_bytes(a.fragmentation_at_allocated_peak)],
        ["reserved but not allocated at the reserved peak", format_bytes(a.fragmentation_at_reserved_peak)],
        ["segments at the allocated peak", f"{a.segments_at_peak:,}", f"large {format_bytes(a.large_segment_bytes_at_peak)}"
         f", small {format_bytes(a.small_segment_bytes_at_peak)}"]], "lrl")]


def _modules_section(est, style: Style) -> list[str]:
    return [style.heading("Per module"), *table([["module", "params", "saved activations", "at peak"]] + [
        [m.module, f"{m.parameters:,}", format_bytes(m.activation_bytes), format_bytes(m.bytes_at_peak)]
        for m in est.modules], "lrrr")]


def _explanation_section(est, style: Style) -> list[str]:
    """The hand arithmetic beside the trace: both in IEC units in columns, the formula with its exact bytes."""
    rows = [["", "by hand", "traced", ""]]
    notes: dict[int, list[str]] = {}
    for row in est.explanation.rows:
        exact = f" = {row.hand_bytes:,} B" + (f"; traced {row.traced_bytes:,} B" if row.traced_bytes != row.hand_bytes
                                               else "")
        rows.append([row.what, format_bytes(row.hand_bytes), format_bytes(row.traced_bytes), row.formula + exact])
        notes[len(rows) - 1] = [f"      {row.note}"] if row.note else []
    lines = table(rows, "lrrl")
    out = [style.heading("How this adds up (by hand → traced)"), lines[0]]
    for i, line in enumerate(lines[1:], start=1):
        out += [line, *notes[i]]
    return out + [f"  · {note}" for note in est.explanation.differences]


def _baselines_section(est, style: Style) -> list[str]:
    if not est.baselines:
        return []
    rows = [[row.rule, format_bytes(row.bytes), "" if row.relative_to_estimate is None
             else f"{row.relative_to_estimate:+.0%}", f"— {row.why}"] for row in est.baselines]
    return ["", style.heading(f"Rules of thumb beside this estimate (vs {est.baselines[0].vs})"),
            *table(rows, "lrrl")]


def render_text(est, colour: bool = False) -> str:
    """The terminal report. Plain text unless `colour` (the CLI passes report.style.use_colour(sys.stdout)).
    An estimate with a framework section (Keras on TensorFlow: report/keras_text.py) gets that section's report,
    plain; so does one whose class has a report of its own."""
    if est.framework is not None:
        return est.framework.render(est)
    if type(est).__str__ is not Estimate.__str__:
        return str(est)
    style = Style(colour)
    out = [*report_header(est, style), "", *_peak_section(est, style), *ranks_section(est, style),
           "", f"{style.heading('Where')}: {where_section(est)}", *lean_loop_note(est),
           "", *_breakdown_section(est, style), "", *_process_section(est, style), *_allocator_section(est, style),
           "", *_modules_section(est, style), "", *_explanation_section(est, style), *_baselines_section(est, style)]
    if est.warnings:
        out += ["", style.warn(style.heading("Assumptions and warnings"))] + [f"  - {w}" for w in est.warnings]
    return "\n".join(out)

def _layout_words(parallel: dict) -> str:
    layout = parallel["layout"]
    degrees = " × ".join(f"{name} {layout[name]}" for name in ("pp", "dp", "tp") if layout[name] > 1) or "1 rank"
    extra = f", offload {layout['offload']}" if layout["offload"] != "none" else ""
    return f"{layout['strategy']}: {layout['world_size']:,} ranks ({degrees}){extra}"


def ranks_section(est, style: Style = PLAIN) -> list[str]:
    """Many ranks: one row per distinct rank role, the most loaded marked, the spread between them."""
    parallel = getattr(est, "parallel", None)
    if parallel is None:
        return []
    cuda = words_for(est).ranks_show_reserved
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
                     *([format_bytes(row.host_bytes)] if host else []),
                     style.strong("◀ most loaded") if row.label == most else ""])
    lines = ["", style.heading(f"Per rank — {_layout_words(parallel)}")]
    lines += table(rows, "lr" + "r" * (len(header) - 3) + "l")
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
