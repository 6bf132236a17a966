"""`trainmem fit`: the largest batch whose high estimate stays under capacity × (1 − margin), the default
margin read from the measured error tables, and the answer stating its headroom."""

import dataclasses
import importlib
import json
import math
import re
from pathlib import Path

import pytest

from trainmem.cli import main
from trainmem.errors import SetupError
from trainmem.devices import get_device
from trainmem.fit import Margin, fit, resolve_margin
from trainmem.targets.cpu_target import CpuTarget
from trainmem.targets.cuda_target import CudaTarget
from trainmem.setup import TrainingSetup
from trainmem.setup.target_options import TargetOptions
from trainmem.units import format_bytes

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
fitmod = importlib.import_module("trainmem.fit")  # the module (trainmem.fit the attribute is the function)
# context= is used as is (point = high); without it the CUDA context's reported range reaches 426 MiB
SMALL_GPU = "custom:capacity=400MiB,cc=8.0,context=287MB"
MLP = "mlp:256-256-10"
SETUP = TrainingSetup.from_mapping({"input_shape": "256"})
PERCENT = re.compile(r"\(([+-]\d+(?:\.\d+)?)%\)|^([+-]\d+(?:\.\d+)?)%$")


def _tables(text: str):
    """Each markdown table of a results file as (header cells, rows of cells)."""
    table: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            yield table[0], [row for row in table[2:] if len(row) == len(table[0])]
            table = []


def _errors(cell: str) -> list[float]:
    return [float(a or b) / 100 for a, b in PERCENT.findall(cell.strip())]


def _counted(text: str) -> str:
    """The file without its sections of rows whose settings are only partly published: their errors say
    what the publication left out (torch.compile, chunked losses), not how far the estimate is off."""
    sections = re.split(r"(?m)^(?=## )", text)
    return "".join(part for part in sections if "partly published" not in part.split("\n", 1)[0])


def worst_low_gpu(text: str) -> float:
    """The most negative relative error in the nvidia-smi (process) and reserved columns of accuracy_gpu.md."""
    errors = [0.0]
    for header, rows in _tables(_counted(text)):
        columns = [i for i, name in enumerate(header) if name.startswith(("process", "reserved"))
                   and "high" not in name]
        errors += [e for row in rows for i in columns for e in _errors(row[i])]
    return min(errors)


def worst_low_cpu(text: str) -> float:
    """The most negative error in the peak-RSS error column of accuracy_cpu.md: an `error` column belongs
    to the nearest column before it that names a measured figure."""
    errors = [0.0]
    for header, rows in _tables(text):
        counter = ""
        for i, name in enumerate(header):
            if name.startswith("meas."):
                counter = name
            elif name == "error" and "RSS" in counter:
                errors += [e for row in rows for e in _errors(row[i])]
    return min(errors)


def _rounded_up(worst_low: float) -> float:
    return math.ceil(round(-worst_low * 100, 6)) / 100


@pytest.mark.parametrize("names, margin, worst", [
    (("accuracy_gpu.md",), Margin(*CudaTarget.fit_margin), worst_low_gpu),
    # one table per bundled CPU family (AMD EPYC, Intel Xeon with AMX): the margin covers the worst of them all
    (("accuracy_cpu.md", "accuracy_cpu_intel_amx.md"), Margin(*CpuTarget.fit_margin), worst_low_cpu)])
def test_default_margin_covers_the_worst_low_error_recorded(names, margin, worst):
    """Never low: the default margin is at least the worst low error in the results files fit's counter has
    (every machine's), and it follows a regenerated file (a stale constant fails here with the value to write)."""
    name = " and ".join(names)
    low = min(worst((RESULTS / one).read_text()) for one in names)
    assert low < 0, f"{name}: no low row parsed; has the table's format changed?"
    assert margin.fraction >= -low, f"{name} records {low:+.2%}: raise the target's fit_margin (targets/)"
    assert margin.fraction == _rounded_up(low), (
        f"{name} now records a worst low error of {low:+.2%}: set the target's fit_margin (targets/) to "
        f"{_rounded_up(low)} and its source line to that figure")
    assert f"{low * 100:+.2f}%".replace("+", "") in margin.source.replace("+", "")


def test_the_parsers_read_each_counter():
    gpu = ("| row | allocated | reserved | process (nvidia-smi) |\n|---|---|---|---|\n"
           "| a | 10 → 9 (-10.00%) | — | 10 → 9.5 (-5.00%) ✗ |\n| b | — | 10 → 9.8 (-2.00%) | — |\n")
    assert worst_low_gpu(gpu) == pytest.approx(-0.05)
    loose = "\n## Rows whose settings are only partly published\n\n" + gpu.replace("-5.00%", "-50.00%")
    assert worst_low_gpu(gpu + loose) == pytest.approx(-0.05)
    cpu = ("| model | meas. tensors MiB | error | est. RSS MiB | meas. RSS MiB | RSS runs MiB | error |\n"
           "|---|---|---|---|---|---|---|\n| m | 3 | -9.000% | 1 | 1 | 1–1 | -4.10% |\n")
    assert worst_low_cpu(cpu) == pytest.approx(-0.041)
    assert _rounded_up(-0.041) == 0.05 and _rounded_up(-0.1420) == 0.15 and _rounded_up(-0.14) == 0.14


def test_margin_is_checked():
    gpu, cpu = get_device("a100-40gb"), get_device("cpu")
    assert resolve_margin(None, gpu) == Margin(*CudaTarget.fit_margin)
    assert resolve_margin(None, cpu) == Margin(*CpuTarget.fit_margin)
    assert resolve_margin("0.1", gpu).fraction == 0.1 and resolve_margin(0, cpu).source == "--margin"
    for bad in (1, 1.5, -0.1, "abc", "nan"):
        with pytest.raises(SetupError, match="0 ≤ m < 1"):
            resolve_margin(bad, gpu)


def test_fit_keeps_the_margin():
    """The answer's high estimate is within capacity × (1 − margin) and the next batch's is not; a smaller
    margin admits a larger batch."""
    tight = fit(MLP, SETUP, SMALL_GPU, margin=0.2)
    loose = fit(MLP, SETUP, SMALL_GPU, margin=0.0)
    budget = int(400 * 2**20 * 0.8)
    assert tight.budget == budget
    assert tight.best_estimate.process_bytes_high <= budget < tight.miss_estimate.process_bytes_high
    assert tight.first_miss == tight.best + 1 and loose.best > tight.best
    assert tight.headroom == 400 * 2**20 - tight.best_estimate.process_bytes_high >= 400 * 2**20 * 0.2
    text = str(tight)
    assert "keeping a 20% margin" in text and "margin from --margin" in text
    assert "headroom" in text and "over the margin" in text


def _estimates_with_spread(monkeypatch, spread: int) -> None:
    """fit's estimates, each with a high figure `spread` above the expected one: whole estimates (the
    exhaustive search, the remedies) and replays of a traced or predicted run (the batch search)."""
    predicted = importlib.import_module("trainmem.fit_predicted")
    for module, name in ((fitmod, "estimate"), (predicted, "assemble_traced")):
        real = getattr(module, name)

        def with_spread(*args, _real=real, **kwargs):
            est = _real(*args, **kwargs)
            return dataclasses.replace(est, process_bytes_high=est.process_bytes + spread)

        monkeypatch.setattr(module, name, with_spread)


def test_fit_compares_the_high_estimate(monkeypatch):
    """A candidate whose expected figure fits but whose high figure does not is refused."""
    spread = 40 * 2**20
    plain = fit(MLP, SETUP, SMALL_GPU, margin=0.0)
    _estimates_with_spread(monkeypatch, spread)
    high = fit(MLP, SETUP, SMALL_GPU, margin=0.0)
    assert high.best < plain.best
    assert high.best_estimate.process_bytes_high == high.best_estimate.process_bytes + spread <= 400 * 2**20
    assert {v: h - b for v, b, h, _ in high.tried} == {v: spread for v, *_ in high.tried}
    assert dict((v, h) for v, _, h, _ in high.tried)[high.best] == high.best_estimate.process_bytes_high


def test_remedies_use_the_high_estimate(monkeypatch):
    spread = 50 * 2**20
    _estimates_with_spread(monkeypatch, spread)
    setup = TrainingSetup.from_mapping({"input_shape": "4096", "optimizer": "adam"})
    result = fit("mlp:4096-4096-4096", setup, SMALL_GPU, margin=0.1, target_options=TargetOptions(cuda_context=100 * 2**20))
    assert result.best is None and result.remedies
    for remedy in result.remedies:
        assert remedy.process_bytes_high == remedy.process_bytes + spread
    assert "Even batch size 1 does not fit: its high estimate" in str(result)


def test_cli_margin_and_json(capsys):
    code = main(["fit", MLP, "--input-shape", "256", "--device", SMALL_GPU, "--margin", "0.1", "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["margin"] == 0.1 and result["margin_source"] == "--margin"
    assert result["budget_bytes"] == int(400 * 2**20 * 0.9)
    assert result["compared"].startswith("process_bytes_high")
    high = result["best_estimate"]["peak"]["process_bytes_high"]
    assert result["headroom_bytes"] == 400 * 2**20 - high and result["headroom_fraction"] >= 0.1
    assert all(set(row) >= {"value", "process_bytes", "process_bytes_high", "fits"} for row in result["tried"])


def test_cli_default_margin_names_its_source(capsys):
    code = main(["fit", MLP, "--input-shape", "256", "--device", SMALL_GPU, "--format", "json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["margin"] == CudaTarget.fit_margin[0]
    assert "accuracy_gpu.md" in result["margin_source"]


@pytest.mark.parametrize("bad", ["1", "-0.2", "ten"])
def test_cli_bad_margin_is_one_line(capsys, bad):
    code = main(["fit", MLP, "--input-shape", "256", "--device", SMALL_GPU, f"--margin={bad}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--margin" in err


@pytest.fixture
def fresh():
    """Each search as in a process of its own. FakeTensorMode caches its dispatch process-wide, and an op
    met again with the same shapes records fewer internal ops (detach, copy_) in coverage.ops: a search
    run after another at the same batch sizes would differ there, and only there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def search(*args, **kwargs):
        FakeTensorMode.cache_clear()
        return fit(*args, **kwargs)

    return search


def _same_answer(new, old) -> None:
    assert (new.best, new.first_miss, new.tried) == (old.best, old.first_miss, old.tried)
    for mine, theirs in ((new.best_estimate, old.best_estimate), (new.miss_estimate, old.miss_estimate)):
        assert (mine and mine.to_dict()) == (theirs and theirs.to_dict())
    how = lambda result: [line for line in result.render(verbose=True).splitlines()  # noqa: E731
                          if not line.startswith("  candidates ")]  # all but the line saying how
    assert how(new) == how(old)


@pytest.mark.heavy
@pytest.mark.parametrize("model, values, device, margin, pair", [
    (MLP, {"input_shape": "256"}, SMALL_GPU, 0.2, [1, 2]),  # batch 1's flags differ: batch 2's stand
    ("tests/models.py:tiny_attention", {"precision": "bf16-mixed"}, "custom:capacity=420MiB,cc=8.0,context=287MB",
     None, [1, 2]),
    ("tests/models.py:tiny_lstm", {"optimizer": "adam"}, SMALL_GPU, 0.1, [1, 2, 4]),  # batch 1: another stream
])
def test_batch_search_answers_as_the_exhaustive_search(fresh, model, values, device, margin, pair):
    """Two traces, the candidates predicted, the answer confirmed by a real trace: the same candidates,
    figures, answer and estimates as tracing every candidate."""
    new = fresh(model, device=device, margin=margin, **values)
    old = fresh(model, device=device, margin=margin, exhaustive=True, **values)
    _same_answer(new, old)
    assert new.search["predicted"] and new.search["traced"] == sorted({*pair, new.best})
    assert "confirmed by a real trace at batch" in new.search["how"]
    assert old.search["traced"] == sorted(v for v, *_ in old.tried)


GUARDED = """
class Guarded(nn.Module):
    # above batch 8 it keeps a wide copy of its input alive for backward
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(256, 256)
    def forward(self, x):
        if x.shape[0] > 8:
            x = (x.repeat(1, 64) * 2)[:, :256]
        return self.layer(x)

def factory():
    return Guarded(), lambda batch: (torch.randn(batch, 256),)
"""


@pytest.mark.heavy
def test_a_wrong_prediction_falls_back_to_tracing_every_candidate(fresh, tmp_factory):
    """Traces at 1/2 (or 2/4) cannot see a branch taken above batch 8: the confirmation trace does, and the
    answer is then the exhaustive search's."""
    model = tmp_factory(GUARDED)
    new = fresh(model, SETUP, SMALL_GPU, margin=0.0)
    old = fresh(model, SETUP, SMALL_GPU, margin=0.0, exhaustive=True)
    _same_answer(new, old)
    assert new.best > 8 and "differs from its prediction" in new.search["how"] and not new.search["predicted"]
    assert "candidates traced, each one: the real trace at batch" in str(new)


def test_setup_as_keywords_like_estimate():
    positional = fit(MLP, SETUP, SMALL_GPU, margin=0.2)
    keywords = fit(MLP, device=SMALL_GPU, margin=0.2, input_shape="256")
    mixed = fit(MLP, setup=TrainingSetup.from_mapping({"input_shape": "256", "optimizer": "adam"}),
                device=SMALL_GPU, margin=0.2, optimizer="sgd")
    assert (keywords.best, keywords.tried) == (positional.best, positional.tried)
    assert mixed.best_estimate.setup.optimizer == "sgd"
    with pytest.raises(SetupError, match="setup keys"):
        fit(MLP, device=SMALL_GPU, input_shap="256")


POOLED = """
class Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 64), nn.Linear(64, 4)
    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))

def factory():
    return Pooled()
"""


def test_the_sequence_search_predicts_from_three_traces_and_confirms_the_answer(tmp_factory):
    setup = TrainingSetup.from_mapping({"input_shape": "8", "input_dtype": "int64", "input_max": 100})
    result = fit(tmp_factory(POOLED), setup, SMALL_GPU, sequence=True, limit=1024, margin=0.2)
    assert result.best == 1024 and result.first_miss is None
    assert result.search["traced"] == [1, 2, 4, 8, 16, 32, 64, 128, 1024] and result.search["predicted"] == [256, 512]
    assert result.search["how"] == ("predicted from the traces at sequence lengths 32, 64, 128, confirmed by real "
                                    "traces at 1024")
    exhaustive = fit(tmp_factory(POOLED), setup, SMALL_GPU, sequence=True, limit=1024, margin=0.2, exhaustive=True)
    assert result.tried == exhaustive.tried and exhaustive.search["how"] == "traced, each one"


ATTENTION = """
class Attention(nn.Module):
    # scores as length x length, materialized: sizes quadratic in the sequence length
    def __init__(self, dim=64):
        super().__init__()
        self.embed, self.qkv, self.head = nn.Embedding(100, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, 4)
    def forward(self, ids):
        q, k, v = self.qkv(self.embed(ids)).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1)
        return self.head((scores @ v).mean(dim=1))

def factory():
    return Attention()
"""


@pytest.mark.heavy
def test_sequence_answer_from_predictions_is_the_exhaustive_one(fresh, tmp_factory):
    """Attention's scores are quadratic in the length: predicted from lengths 2, 4 and 8, the search gives the
    exhaustive search's candidates, figures and answer, with the longest that fits and the first that does not
    traced for real."""
    setup = TrainingSetup.from_mapping({"input_shape": "8", "input_dtype": "int64", "input_max": 100, "batch_size": 4})
    model, device = tmp_factory(ATTENTION), "custom:capacity=420MiB,cc=8.0,context=287MB"
    new = fresh(model, setup, device, sequence=True, limit=8192, margin=0.0)
    old = fresh(model, setup, device, sequence=True, limit=8192, margin=0.0, exhaustive=True)
    _same_answer(new, old)
    assert 128 < new.best < 8192 and len(old.search["traced"]) == len(old.tried)
    # traced: below the three points and the points, the bisection's last lengths (not multiples of 32), the answer
    traced = new.search["traced"]
    assert {1, 2, 4, 8, 16, 32, 64, 128, new.best, new.first_miss} <= set(traced)
    assert all(v % 32 for v in set(traced) - {1, 2, 4, 8, 16, 32, 64, 128, new.best, new.first_miss})
    assert new.search["predicted"] and all(v % 32 == 0 for v in new.search["predicted"])


def test_the_pair_is_traced_only_as_far_as_the_search_goes():
    """Up to batch 2 nothing is predicted: each candidate is traced, and the answer is the exhaustive one."""
    new = fit(MLP, SETUP, SMALL_GPU, limit=2, margin=0.2)
    assert (new.best, new.first_miss, new.search["traced"], new.search["predicted"]) == (2, None, [1, 2], [])
    assert new.search["how"] == "traced, each one (batch 1, 2): nothing left to predict"


@pytest.mark.heavy
def test_device_and_setup_as_estimate_takes_them():
    """fit(model, device=torch.device(...) or a Device, **setup) as estimate(); the old positional call still
    answers alike."""
    import torch

    from trainmem.devices import get_device

    positional = fit(MLP, SETUP, "cpu", limit=4)
    by_torch = fit(MLP, device=torch.device("cpu"), input_shape="256", limit=4)
    assert (by_torch.best, by_torch.tried, by_torch.device_name) == (positional.best, positional.tried, "cpu")
    as_device = fit(MLP, device=get_device(SMALL_GPU), margin=0.2, input_shape="256")
    assert (as_device.best, as_device.tried) == (fit(MLP, SETUP, SMALL_GPU, margin=0.2).best,
                                                 fit(MLP, SETUP, SMALL_GPU, margin=0.2).tried)


def test_batch_size_is_searched_not_given():
    """The batch search searches batch_size: a batch_size keyword would be ignored, so it is refused; the
    sequence search takes it as the batch to search at."""
    with pytest.raises(SetupError) as info:
        fit(MLP, device=SMALL_GPU, input_shape="256", batch_size=8)
    assert str(info.value).startswith("fit(): expected no batch_size for fit(): it searches the batch size")
    result = fit(MLP, device=SMALL_GPU, input_shape="16,256", batch_size=2, sequence=True, limit=4, margin=0.2)
    assert result.best_estimate.setup.batch_size == 2


FIT_ARGS = ["fit", MLP, "--input-shape", "256", "--device", SMALL_GPU, "--margin", "0.2"]


def test_the_text_leads_with_the_answer_and_lists_every_candidate_with_verbose(capsys):
    """The default text: the answer on the line after the title, its high estimate and headroom, and only the
    candidates that decided it (the answer, the fitting one below it, the first miss); --verbose lists every one,
    as the JSON does."""
    assert main(FIT_ARGS) == 0
    short = capsys.readouterr().out
    assert main([*FIT_ARGS, "--verbose"]) == 0
    verbose = capsys.readouterr().out
    assert main([*FIT_ARGS, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    best, miss, tried = data["best"], data["first_miss"], data["tried"]
    answer = short.splitlines()[1]
    assert answer.startswith(f"Largest batch size that fits: {best:,} — peak ")
    high = data["best_estimate"]["peak"]["process_bytes_high"]
    assert format_bytes(high) in answer and "headroom" in answer and "the margin asks for 20%" in answer
    rows = lambda text: re.findall(r"^  batch size +([\d,]+): ", text, flags=re.M)  # noqa: E731
    below = max(row["value"] for row in tried if row["fits"] and row["value"] < best)
    assert [int(v.replace(",", "")) for v in rows(short)] == [below, best, miss]
    assert f"{len(tried) - 3} more candidates evaluated: --verbose lists every one" in short
    assert len(tried) > 10 and len(short.splitlines()) <= 15 < len(verbose.splitlines())
    assert [int(v.replace(",", "")) for v in rows(verbose)] == sorted(row["value"] for row in tried)
    assert "more candidates evaluated" not in verbose and "← the answer" in verbose
    assert str(fit(MLP, SETUP, SMALL_GPU, margin=0.2)) == short.rstrip("\n")


def _hand_made(peaks, tried, **more):
    """A FitResult as fit() would return it, for the renderer alone: every value fits, the last is the answer."""
    from trainmem.fit import CandidatePeak, FitResult

    class Best:  # the few figures the answer's lines read
        process_bytes_high, process_bytes, peak_phase, peak_op, breakdown = tried[-1][2], tried[-1][1], "backward", "mm", {}

    return FitResult(dimension="batch size", best=tried[-1][0], best_estimate=Best(), first_miss=None,
                     miss_estimate=None, tried=tried, remedies=[], device_name="a100-40gb", capacity=40 * 2**30,
                     margin=Margin(0.1, "--margin"), peaks={v: CandidatePeak(**p) for v, p in peaks.items()}, **more)


MiB = 2**20


def test_a_larger_batch_needing_less_is_explained_by_the_allocator():
    """Batch 4 below batch 2 with more tensor bytes but fewer reserved: one line, naming the allocator's
    segments; both rows are in the short table."""
    peak = dict(phase="backward", op="mm", allocated_bytes=None, process_bytes=0, process_parts={})
    result = _hand_made({1: dict(peak, tensor_bytes=10 * MiB, reserved_bytes=40 * MiB, segments=5),
                         2: dict(peak, tensor_bytes=20 * MiB, reserved_bytes=50 * MiB, segments=7),
                         4: dict(peak, tensor_bytes=30 * MiB, reserved_bytes=48 * MiB, segments=6),
                         8: dict(peak, tensor_bytes=60 * MiB, reserved_bytes=80 * MiB, segments=8)},
                        [(1, 0, 470 * MiB, True), (2, 0, 476 * MiB, True), (4, 0, 474 * MiB, True),
                         (8, 0, 500 * MiB, True)])
    lines = str(result).splitlines()
    why = [line for line in lines if "needs less than" in line]
    assert why == ["  batch size 4 needs less than 2 (474.00 MiB vs 476.00 MiB, high): its tensors hold as much or "
                   "more (30.00 MiB vs 20.00 MiB), but the caching allocator reserves less (48.00 MiB in 6 segments "
                   "vs 50.00 MiB in 7): it rounds blocks and splits or reuses its segments differently at each size, "
                   "so a smaller one can leave a free block too small for a later request"]
    assert [line.split(":")[0].split()[-1] for line in lines if re.match(r"^  batch size +\d+: ", line)] == ["2", "4", "8"]


def test_a_larger_batch_needing_less_is_explained_by_its_peak_moving():
    """Fewer tensor bytes at the peak: the peak's phase and op, before and after."""
    base = dict(allocated_bytes=None, reserved_bytes=None, segments=None, process_bytes=0, process_parts={})
    result = _hand_made({1: dict(base, phase="backward", op="convolution_backward", tensor_bytes=90 * MiB),
                         2: dict(base, phase="forward", op="addmm", tensor_bytes=80 * MiB)},
                        [(1, 0, 300 * MiB, True), (2, 0, 290 * MiB, True)])
    assert ("batch size 2 needs less than 1 (290.00 MiB vs 300.00 MiB, high): the traced step holds fewer tensor "
            "bytes at its peak (80.00 MiB vs 90.00 MiB): its peak moves from backward (op convolution_backward) to "
            "forward (op addmm); a kernel can take another path at another size") in str(result)


def test_a_larger_batch_needing_less_is_explained_by_a_process_part():
    """The CPU: the same tensors, a smaller resident heap."""
    base = dict(phase="forward", op="stack", tensor_bytes=5 * MiB, allocated_bytes=5 * MiB, reserved_bytes=None,
                segments=None)
    result = _hand_made({8: dict(base, process_bytes=400 * MiB, process_parts={"process_floor": 300 * MiB,
                                                                               "tensor_heap_resident": 78 * MiB}),
                         16: dict(base, process_bytes=399 * MiB, process_parts={"process_floor": 300 * MiB,
                                                                                "tensor_heap_resident": 76 * MiB})},
                        [(8, 400 * MiB, 428 * MiB, True), (16, 399 * MiB, 427 * MiB, True)])
    assert ("batch size 16 needs less than 8 (427.00 MiB vs 428.00 MiB, high): the process's tensor heap resident "
            "is smaller (76.00 MiB vs 78.00 MiB): glibc keeps freed blocks under its mmap threshold") in str(result)


def test_a_monotone_search_says_nothing_of_it():
    peak = dict(phase="backward", op="mm", tensor_bytes=MiB, allocated_bytes=None, reserved_bytes=None, segments=None,
                process_bytes=0, process_parts={})
    result = _hand_made({1: peak, 2: peak}, [(1, 0, 300 * MiB, True), (2, 0, 300 * MiB, True)])
    assert "needs less than" not in str(result)


@pytest.mark.heavy
def test_a_real_larger_batch_needing_less_is_explained():
    """tests/models.py:mobilenet_like on an A100: batch 4's high estimate is below batch 2's, the caching
    allocator reserving one segment fewer."""
    result = fit("tests/models.py:mobilenet_like", device="a100-40gb", margin=0.0, limit=4)
    high = {value: h for value, _, h, _ in result.tried}
    assert high[4] < high[2]
    assert "batch size 4 needs less than 2" in str(result) and "caching allocator reserves less" in str(result)
