"""The CPU allocator models on hand-built event streams, expected values from the rules in alloc/cpu_heap.py
(c10's 64-byte posix_memalign; glibc's mmap threshold, heap growth, coalescing and trimming)."""

import pytest

from trainmem.alloc.cpu_heap import MMAP_THRESHOLD_START, PAGE, GlibcModel, aligned, replay_tensors
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase


def ev(action, nbytes, key, category=Category.TEMPORARIES):
    return DeviceEvent(action, nbytes, key, category, Phase.FORWARD, "m", "op", 0, 0)


def test_tensor_replay_rounds_each_request_to_64_bytes():
    stream = [ev("alloc", 4, 1), ev("alloc", 100, 2), ev("free", 4, 1), ev("alloc", 64, 3)]
    replay = replay_tensors(stream)
    assert aligned(4) == 64 and aligned(100) == 128
    assert replay.peak_bytes == 64 + 128  # the later 64-byte chunk comes after a 64-byte free
    assert replay.final_bytes == 192


def test_peak_live_set_is_the_one_at_the_peak():
    stream = [ev("alloc", 1000, 1, Category.PARAMETERS), ev("alloc", 5000, 2), ev("free", 5000, 2), ev("alloc", 10, 3)]
    replay = replay_tensors(stream)
    assert set(replay.live_at_peak) == {1, 2}


def test_large_request_is_mapped_and_returned():
    glibc = GlibcModel()
    glibc.malloc(1, 1 << 20)
    assert glibc.mapped >= 1 << 20 and glibc.brk == 0
    glibc.free(1)
    assert glibc.mapped == 0
    assert glibc.mmap_threshold > 1 << 20  # the freed mapping raised the threshold to its size


def test_after_threshold_rises_same_size_goes_to_heap_and_stays_resident():
    glibc = GlibcModel()
    glibc.malloc(1, 1 << 20)
    glibc.free(1)
    glibc.malloc(2, 1 << 20)
    assert glibc.mapped == 0 and glibc.brk >= 1 << 20
    glibc.malloc(3, 4096)  # a small chunk above it pins the heap top
    glibc.free(2)
    assert glibc.brk >= 1 << 20  # interior free memory stays resident


def test_top_is_trimmed_past_the_trim_threshold():
    glibc = GlibcModel()
    glibc.malloc(1, 1000)
    glibc.malloc(2, 100_000)
    high = glibc.brk
    glibc.free(2)
    assert glibc.brk == high  # 100 kB free at the top is below the 256 KiB trim threshold
    glibc.malloc(3, 120_000)
    glibc.malloc(4, 120_000)
    glibc.free(4)
    glibc.free(3)
    assert glibc.brk < glibc.top_start + 2 * MMAP_THRESHOLD_START + PAGE


def test_freed_chunks_coalesce_and_are_reused():
    glibc = GlibcModel()
    for key in range(4):
        glibc.malloc(key, 10_000)
    top = glibc.brk
    glibc.free(1)
    glibc.free(2)
    glibc.malloc(9, 19_000)  # fits in the merged hole of chunks 1 and 2
    assert glibc.brk == top


# ---- runtime small objects interleaved with the tensors (alloc/small_objects.py) ----------------------

from trainmem.alloc.cpu_heap import replay_actions  # noqa: E402
from trainmem.alloc.small_objects import Action, family_of, family_rows, interleave, load_table  # noqa: E402
from trainmem.frontends.libraries import code_libraries, model_libraries  # noqa: E402


def pev(action, nbytes, key, phase, op="op", step=1):
    return DeviceEvent(action, nbytes, key, Category.TEMPORARIES, phase, "m", op, step, 0)


def one_row(objects, op="op", phase="forward"):
    return {"ops": {f"{op}|{phase}|first": {"allocs": 1, "objects": objects}}, "phases": {}}


def test_companion_object_is_freed_with_its_tensor():
    stream = [pev("alloc", 1000, 1, Phase.FORWARD), pev("alloc", 1000, 2, Phase.FORWARD), pev("free", 1000, 1, Phase.FORWARD)]
    actions = interleave(stream, one_row([[176, 0, ["companion"], 1.0]])).actions
    keys = [(a.action, a.key) for a in actions]
    assert keys == [("alloc", 1), ("alloc", ("object", 1)), ("alloc", 2), ("alloc", ("object", 2)),
                    ("free", 1), ("free", ("object", 1))]


def test_transient_object_is_freed_at_once_before_the_next_tensor_event():
    stream = [pev("alloc", 1000, 1, Phase.FORWARD), pev("alloc", 1000, 2, Phase.FORWARD)]
    actions = interleave(stream, one_row([[40, 0, ["transient"], 1.0], [96, 0, ["never"], 1.0]])).actions
    assert [(a.action, a.key, a.transient) for a in actions[:4]] == [
        ("alloc", 1, False), ("alloc", ("object", 1), True), ("alloc", ("object", 2), False), ("alloc", 2, False)]
    # one transient action replays as its malloc followed by its free
    spelled = [b for a in actions for b in ([Action(a.action, a.key, a.nbytes, a.aligned, False), Action("free", a.key)]
                                            if a.transient else [a])]
    assert replay_actions(actions) == replay_actions(spelled)


def test_fractional_rate_places_one_object_per_two_allocations_and_lifetimes_follow_the_stream():
    stream = [pev("alloc", 64, k, Phase.FORWARD) for k in range(4)] + [pev("alloc", 64, 9, Phase.BACKWARD, "bw"),
                                                                      pev("free", 64, 0, Phase.BACKWARD, "bw")]
    table = one_row([[96, 0, ["same", 1], 0.5], [24, 0, ["phase", "backward", 0, 0], 0.5], [8, 0, ["never"], 0.25]])
    result = interleave(stream, table)
    allocs = [a for a in result.actions if a.action == "alloc" and isinstance(a.key, tuple)]
    assert [a.nbytes for a in allocs] == [96, 24, 96, 24, 8]  # 0.5 per allocation: after the 2nd and 4th
    order = [(a.action, a.key) for a in result.actions]
    first = order.index(("alloc", ("object", 1)))  # after tensor 1; "same 1": freed after tensor 2's event
    assert order[first + 3] == ("free", ("object", 1))
    assert order.index(("free", ("object", 2))) > order.index(("alloc", 9))  # at the start of backward
    assert ("free", ("object", 5)) not in order  # never freed
    assert result.defaulted_ops == {"bw|backward": 1}  # no row, no phase average: nothing placed, and said so


def test_an_object_whose_phase_has_no_event_in_its_step_dies_as_the_step_ends():
    """SGD with momentum allocates nothing in its optimizer step after the first: an object the table frees in
    the optimizer phase dies where that phase runs, at the end of its step, never 'never' (which leaked the
    objects of every step of a long run)."""
    table = {"ops": {"op|forward|later": {"allocs": 1, "objects": [[64, 0, ["phase", "optimizer", 0, 3], 1.0]]}},
             "phases": {}}
    stream = [pev("alloc", 64, 0, Phase.FORWARD, step=0),  # the first step: the table has no first-step row
              pev("alloc", 64, 1, Phase.FORWARD, step=1), pev("alloc", 64, 2, Phase.BACKWARD, "bw", step=1),
              pev("free", 64, 1, Phase.BACKWARD, "bw", step=1), pev("alloc", 64, 3, Phase.FORWARD, step=2)]
    order = [(a.action, a.key) for a in interleave(stream, table).actions]
    freed = order.index(("free", ("object", 1)))
    assert order.index(("free", 1)) < freed < order.index(("alloc", 3))  # after step 1's last event, before step 2
    assert ("free", ("object", 2)) not in order  # step 2 has no event after it: alive at the end of the run


def test_a_small_object_above_a_freed_heap_tensor_keeps_the_heap_from_shrinking():
    """The pinning mechanism: once the threshold has risen, a 1 MiB chunk comes from the heap. Freed
    alone, it merges into the top and a later 1.5 MiB chunk reuses it; with a live object above it,
    the hole stays apart and the 1.5 MiB chunk extends the heap. (Plain mallocs here: a memalign'd
    chunk's spare tail goes to the tcache and pins it by itself, as _int_memalign frees it.)"""
    raise_threshold = [Action("alloc", "big0", 4 << 20), Action("free", "big0")]
    tensor = [Action("alloc", "t", 1 << 20, aligned=False)]
    alone = raise_threshold + tensor + [Action("free", "t"), Action("alloc", "t2", 3 << 19, aligned=False)]
    pinned = raise_threshold + tensor + [Action("alloc", "o", 200, aligned=False), Action("free", "t"),
                                         Action("alloc", "t2", 3 << 19, aligned=False)]
    glibc_alone, glibc_pinned = GlibcModel(), GlibcModel()
    for model, actions in ((glibc_alone, alone), (glibc_pinned, pinned)):
        for a in actions:
            if a.action == "free":
                model.free(a.key)
            elif a.aligned:
                model.malloc(a.key, a.nbytes)
            else:
                model.malloc_plain(a.key, a.nbytes)
    assert glibc_alone.brk < 2 << 20 < (5 << 19) <= glibc_pinned.brk  # 1.5 MiB reuses the top vs 1 + 1.5 MiB
    assert replay_actions(pinned) == glibc_pinned.peak_resident


def test_pinned_bound_never_merges_into_the_top():
    actions = [Action("alloc", k, 50_000, aligned=False) for k in (1, 2)] + [
        Action("free", 2), Action("free", 1), Action("alloc", 3, 110_000, aligned=False)]
    assert replay_actions(actions, pinned=True) > replay_actions(actions)  # the freed 100 kB cannot take 110 kB


def test_small_object_table_names_its_source():
    for family in ("torch", "transformers"):
        rows = family_rows(load_table(), family)
        assert rows["source"]["command"].startswith("python benchmarks/calibrate_small_objects.py")
        assert rows["source"]["torch"] and rows["source"]["date"] and len(rows["source"]["runs"]) >= 3
        assert rows["ops"] and rows["phases"]
    # GPT-2 is benchmarks/hf_cpu_rss.py's held-out model: no calibration run may be one
    assert not any("gpt2" in run for run in family_rows(load_table(), "transformers")["source"]["runs"])


def test_a_transformers_model_takes_the_transformers_rows_and_a_plain_one_the_torch_rows():
    # SiLU runs in tests/data/tiny_llama (a transformers calibration model), in no model of the zoo
    stream = [pev("alloc", 1 << 20, 1, Phase.FORWARD, "silu"), pev("free", 1 << 20, 1, Phase.FORWARD, "silu")]
    assert interleave(stream, family="torch").defaulted_ops == {"silu|forward": 1}
    assert interleave(stream, family="transformers").defaulted_ops == {}
    assert family_of(("transformers",)) == "transformers" and family_of(("peft", "timm")) == "torch"


@pytest.mark.heavy  # imports peft and transformers
def test_code_libraries_counts_the_modules_own_classes_not_a_wrappers_mixins():
    import torch

    peft = pytest.importorskip("peft")
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    wrapped = peft.get_peft_model(plain, peft.LoraConfig(r=2, target_modules=["0"]))
    # PeftModel derives from transformers' PushToHubMixin: the process imports transformers (model_libraries),
    # but the code between the ops is peft's and torch's
    assert "transformers" in model_libraries(wrapped)
    assert code_libraries(wrapped) == ("peft",)


def test_cpu_estimate_states_its_high_figure_and_why():
    import trainmem

    est = trainmem.estimate("mlp:1000-100-100-100-100-10", batch_size=256, optimizer="adam", input_shape="1000")
    spread = load_table()["spread"]["above_median"]
    assert est.process_bytes_high >= int(est.process_bytes * (1 + spread)) > est.process_bytes
    assert est.to_dict()["peak"]["process_bytes_high"] == est.process_bytes_high
    assert any("process_bytes_high" in w and "pinned" in w for w in est.warnings)
