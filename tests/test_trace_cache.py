"""The trace cache (trace/cache_store.py, cache_key.py, cache_codec.py): a run served from it gives the estimate a
fresh trace gives, field for field; anything that changes the trace changes the key; a damaged or hostile file
is a miss, never an answer; `--no-cache` and `trainmem cache` work without torch where they can."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, skip_where_torch_refuses, zoo
from trainmem import estimate
from trainmem.trace import cache_store
from trainmem.trace.cache_codec import BadCacheFile, decode, encode

TINY_LLAMA = ROOT / "tests" / "data" / "tiny_llama"

# runs across the recorder's features: kernel calls (LSTM, attention, CUDA's rules), checkpointing, masks and
# data-dependent shapes, LoRA/QLoRA, mixed precision, the loops, the CUDA target's semantics
RUNS = [
    (zoo("tiny_conv"), dict(batch_size=2)),
    (zoo("tiny_lstm"), dict(batch_size=2)),
    (zoo("tiny_gpt"), dict(batch_size=2, checkpointing=True, loop="lean")),
    (zoo("tiny_attention"), dict(batch_size=2, device="a100-40gb", precision="bf16-mixed")),
    (zoo("moe_token_mask"), dict(batch_size=2)),
    (zoo("packed_lstm_tagger"), dict(batch_size=2, optimizer="adamw")),
    (zoo("cnn_bn"), dict(batch_size=2, device="h100-80gb", precision="fp16-mixed", loop="step-fn")),
    (f"hf:{TINY_LLAMA}", dict(batch_size=2, seq_len=16, device="a100-40gb", qlora=True)),
    (f"hf:{TINY_LLAMA}", dict(batch_size=2, seq_len=16, lora="r=4,alpha=8,targets=q_proj,v_proj")),
]


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINMEM_CACHE_DIR", str(tmp_path / "cache"))
    with cache_store.switched(True):
        yield tmp_path / "cache" / cache_store.SUBDIRECTORY


@pytest.mark.parametrize("model,setup", RUNS, ids=lambda v: Path(str(v)).name if isinstance(v, str) else "")
def test_a_reused_trace_gives_the_fresh_estimate(cache_on, model, setup):
    fresh = estimate(model, cache=False, **setup)
    stored = estimate(model, **setup)
    reused = estimate(model, **setup)
    assert (fresh.trace_cache.used, stored.trace_cache.used, reused.trace_cache.used) == ("off", "stored", "reused")
    assert reused == fresh == stored  # every figure, table, note and explanation (dataclass equality)
    assert reused.to_dict() == fresh.to_dict() and str(reused) == str(fresh)
    assert reused.replay_input.events == fresh.replay_input.events  # the device stream, event for event
    traces = [path for path in cache_on.glob("*.json.gz")
              if not path.name.endswith((cache_store.RESULT_SUFFIX, cache_store.RECORD_SUFFIX))]
    assert len(traces) == 1


@pytest.mark.heavy
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_reused_rank_trace_gives_the_fresh_estimate(cache_on, strategy):
    """Each rank role's trace is stored under the single-process key and the role (parallel/rank_cache.py): the
    same layout asked again reads them, and every figure is the fresh one's."""
    skip_where_torch_refuses(strategy)
    setup = dict(batch_size=2, strategy=strategy, world_size=2, device="a100-40gb")
    fresh = estimate(zoo("tiny_gpt"), cache=False, **setup)
    stored = estimate(zoo("tiny_gpt"), **setup)
    roles = sorted(cache_on.glob("*.json.gz"))
    reused = estimate(zoo("tiny_gpt"), **setup)
    assert reused == fresh == stored and reused.to_dict() == fresh.to_dict()
    assert (stored.trace_cache.used, reused.trace_cache.used) == ("stored", "reused")
    assert roles and sorted(cache_on.glob("*.json.gz")) == roles  # the third estimate stored nothing new
    other = estimate(zoo("tiny_gpt"), **{**setup, "world_size": 4})  # another layout: its own traces
    assert other.allocated_bytes != reused.allocated_bytes or strategy == "ddp"
    assert len(list(cache_on.glob("*.json.gz"))) > len(roles)


def test_the_codec_is_exact_type_for_type():
    from trainmem.estimate.orchestrate import prepare, trace
    from trainmem.setup import TrainingSetup

    setup = TrainingSetup.from_mapping(dict(batch_size=2), where="test")
    traced = trace(prepare(zoo("tiny_lstm"), setup, "a100-40gb"), setup)
    back = decode(json.loads(json.dumps(encode(traced))))
    assert back == traced and back.trace == traced.trace
    assert back.trace.kernel_calls and back.trace.kernel_calls == traced.trace.kernel_calls
    for mine, theirs in zip(back.trace.kernel_calls, traced.trace.kernel_calls):
        assert [type(a) for a in mine.args] == [type(a) for a in theirs.args]
    assert type(back.op_counts) is type(traced.op_counts)
    assert {type(e.phase) for e in back.trace.events} == {type(e.phase) for e in traced.trace.events}


def _key_of(model, **setup_values):
    from trainmem.estimate.orchestrate import prepare
    from trainmem.setup import TrainingSetup
    from trainmem.trace import step as training
    from trainmem.trace.cache_key import trace_key
    from trainmem.trace.meta_build import building_on_meta

    setup = TrainingSetup.from_mapping(setup_values, where="test")
    chosen = prepare(model, setup)
    with building_on_meta():
        built, make_batch, loss_fn = training.unpack_built(chosen.source.build(), chosen.source)
    return trace_key(built, make_batch, loss_fn, chosen.source, setup, chosen.target.kernel_ops(),
                     chosen.target.trace_semantics())


def test_the_key_changes_with_what_changes_the_trace(tmp_factory):
    body = """class Net(nn.Module):
    def __init__(self, p=0.1, heads=2):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, heads, batch_first=True, dropout=p)
        self.scale = SCALE

    def forward(self, x):
        return self.attn(x * self.scale, x, x)[0].sum(-1)

def factory():
    return Net(P, HEADS)
"""

    def key(p="0.1", heads="2", scale="1.0", **setup):
        ref = tmp_factory(body.replace("SCALE", scale).replace("P,", p + ",").replace("HEADS", heads))
        return _key_of(ref, **{"batch_size": 2, "input_shape": "4,16", "loss": "sum", **setup})

    base = key()
    assert key() == base  # the same run: the same key
    assert key(heads="4") != base  # same parameter shapes, other attention activations
    assert key(p="0.0") != base  # a dropout probability
    assert key(scale="2.0") != base  # a value only the file's text holds
    assert key(batch_size=3) != base and key(optimizer="sgd") != base and key(precision="bf16-mixed") != base
    assert _key_of(zoo("tiny_conv"), batch_size=2) != _key_of(zoo("tiny_conv"), batch_size=2, loop="lean")


def test_a_model_described_only_by_its_address_is_traced_each_time(cache_on, tmp_factory):
    ref = tmp_factory("""class Opaque:
    __slots__ = ()

class Net(nn.Linear):
    def __init__(self):
        super().__init__(8, 2)
        self.thing = Opaque()

def factory():
    return Net()
""")
    first = estimate(ref, batch_size=2, input_shape="8")
    assert first.trace_cache.used == "not cached" and "address" in first.trace_cache.detail
    assert estimate(ref, batch_size=2, input_shape="8").trace_cache.used == "not cached"
    assert not list(cache_on.glob("*.json.gz"))


def _stored_file(cache_on) -> Path:
    estimate(zoo("tiny_conv"), batch_size=2)
    (path,) = (p for p in cache_on.glob("*.json.gz") if not p.name.endswith(cache_store.RESULT_SUFFIX))
    return path


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "not json", "other format", "wrong types",
                                    "unknown tag", "foreign enum", "too large decompressed", "deep nesting"])
def test_a_damaged_or_hostile_file_is_a_miss(cache_on, damage, monkeypatch):
    path = _stored_file(cache_on)
    data = json.loads(gzip.decompress(path.read_bytes()))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:50])
    elif damage == "not gzip":
        path.write_bytes(b"\x00" * 100)
    elif damage == "not json":
        path.write_bytes(gzip.compress(b"{not json"))
    elif damage == "too large decompressed":
        monkeypatch.setattr(cache_store, "MAX_DECODED_BYTES", 1000)
    elif damage == "deep nesting":
        path.write_bytes(gzip.compress(b"[" * 100_000 + b"]" * 100_000))
    else:
        if damage == "other format":
            data["format"] = 999
        elif damage == "wrong types":
            data["facts"]["parameters"] = "a lot"
        elif damage == "unknown tag":
            data["facts"]["resolved"] = {"pickle": "cos\nsystem\n"}
        elif damage == "foreign enum":
            data["facts"]["resolved"] = {"enum": ["os", "system", "ls"]}
        path.write_bytes(gzip.compress(json.dumps(data).encode()))
    again = estimate(zoo("tiny_conv"), batch_size=2)
    assert again.trace_cache.used == "stored"  # traced again and stored over the bad file
    assert again == estimate(zoo("tiny_conv"), batch_size=2, cache=False)


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_file_that_is_not_a_regular_file_is_never_read(cache_on, kind, tmp_path):
    """A FIFO under a trace's name would block a read for ever; a link could point anywhere."""
    import os

    path = _stored_file(cache_on)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "elsewhere").write_bytes(b"\x1f\x8b" + b"\x00" * 100)
        path.symlink_to(tmp_path / "elsewhere")
    assert estimate(zoo("tiny_conv"), batch_size=2).trace_cache.used == "stored"  # removed, traced, stored again
    assert path.is_file() and not path.is_symlink()


def test_decoding_refuses_what_is_not_a_trace():
    for data in (None, [], {"format": 1}, {"format": 1, "strings": [1]}):
        with pytest.raises(BadCacheFile):
            decode(data)


def test_the_directory_keeps_the_most_recently_used(cache_on, monkeypatch):
    import os

    gpu = dict(device="a100-40gb")  # a trace a file (the CPU keeps its heap replay beside it)
    for batch in (2, 3, 4):
        estimate(zoo("tiny_conv"), batch_size=batch, **gpu)
    files = sorted(cache_on.glob("*.json.gz"), key=lambda p: p.stat().st_mtime)
    for age, path in enumerate(files):
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    assert estimate(zoo("tiny_conv"), batch_size=2, **gpu).trace_cache.used == "reused"  # touches its file
    kept = sum(p.stat().st_size for p in files) - files[0].stat().st_size  # room for two
    survivors = set(cache_on.glob("*.json.gz"))
    cache_store.evict(kept)
    assert len(set(cache_on.glob("*.json.gz"))) == 2 and survivors - set(cache_on.glob("*.json.gz"))
    assert estimate(zoo("tiny_conv"), batch_size=2, **gpu).trace_cache.used == "reused"


def _trainmem(*args, env_dir):
    import os

    env = {**os.environ, "TRAINMEM_CACHE_DIR": str(env_dir)}
    return subprocess.run([sys.executable, "-m", "trainmem", *args], capture_output=True, text=True, env=env,
                          timeout=300)


REUSED = "trainmem: trace reused from the cache (traced "


def test_the_command_reuses_stores_and_clears(tmp_path):
    args = ("estimate", "mlp:64-32-10", "--batch-size", "4")
    first, second = (_trainmem(*args, env_dir=tmp_path) for _ in range(2))
    off = _trainmem(*args, "--no-cache", env_dir=tmp_path)
    assert [REUSED in run.stderr for run in (first, second, off)] == [False, True, False]
    assert first.stdout == second.stdout == off.stdout  # the same bytes however the answer was reached
    as_json = _trainmem(*args, "--format", "json", env_dir=tmp_path)
    assert as_json.stderr == "" and "trace_cache" not in json.loads(as_json.stdout)  # JSON keeps stderr quiet
    info = json.loads(_trainmem("cache", "--format", "json", env_dir=tmp_path).stdout)
    # one trace, the lean loop's, from which the inline loop's is derived (trace/loop_twin.py); the first's heap
    assert (info["traces"], info["results"]) == (1, 1)
    cleared = _trainmem("cache", "clear", env_dir=tmp_path)
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed 1 trace"), cleared.stdout
    assert json.loads(_trainmem("cache", "--format", "json", env_dir=tmp_path).stdout)["traces"] == 0
    bad = _trainmem("cache", "empty", env_dir=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid choice: 'empty'" in bad.stderr


def test_a_fresh_process_traces_many_ranks(tmp_path):
    """The first import of torch._dynamo in a process can come from a model's build on meta; a many-rank trace
    then needs the whole package (the process group's initialization reads it)."""
    skip_where_torch_refuses("ddp")
    done = _trainmem("estimate", zoo("tiny_gpt"), "--batch-size", "2", "--strategy", "ddp", "--world-size", "2",
                     "--no-cache", env_dir=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_cache_command_imports_no_torch(tmp_path):
    code = ("import sys; from trainmem.cli.main import main\n"
            "try:\n    main(['cache'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "TRAINMEM_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr


def test_a_model_that_imports_dynamo_while_built_gets_it_off_meta():
    """building_on_meta imports torch._dynamo only when the model's code asks for it, with the meta device's
    modes off (its import reads tensors on torch 2.6), and the module keeps its own spec."""
    code = """import sys, torch
from trainmem.trace.meta_build import building_on_meta
assert 'torch._dynamo' not in sys.modules
with building_on_meta():
    import torch._dynamo
    made = torch.ones(3)
assert made.device.type == 'meta', made.device
assert type(torch._dynamo.__spec__.loader).__name__ == 'SourceFileLoader', torch._dynamo.__spec__
assert not any(type(f).__name__ == 'DynamoOffMeta' for f in sys.meta_path)
# imported once, whole: every submodule it imported is an attribute of the package (torch.distributed's
# init_process_group reads torch._dynamo.trace_rules)
missing = {k.split('.')[2] for k in sys.modules if k.startswith('torch._dynamo.')} - set(vars(torch._dynamo))
assert not missing, missing
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("ref,flags", [(zoo("tiny_conv"), ["--batch-size", "2"]),
                                       (f"hf:{TINY_LLAMA}", ["--batch-size", "2", "--seq-len", "16"])])
def test_the_key_is_the_same_in_every_process(tmp_path, ref, flags):
    """A model file is loaded under a module name made from its path; str's hash() would differ per process."""
    runs = [_trainmem("estimate", ref, *flags, env_dir=tmp_path) for _ in range(2)]
    assert [REUSED in run.stderr for run in runs] == [False, True] and runs[0].stdout == runs[1].stdout


def test_the_cpu_heap_replay_is_kept_beside_its_trace(cache_on, monkeypatch):
    """A CPU estimate's replay of glibc's heap is a function of the trace, the CPU and the run's length: a reused
    trace reuses it (targets/cpu_target.py _heap_key); another run length replays again."""
    from trainmem.targets import cpu_target

    fresh = estimate(zoo("tiny_gpt"), batch_size=2, cache=False)
    stored = estimate(zoo("tiny_gpt"), batch_size=2)
    assert len(list(cache_on.glob("*.json.gz"))) == 2  # the trace and its heap
    assert len(list(cache_on.glob("*" + cache_store.RESULT_SUFFIX))) == 1
    monkeypatch.setattr(cpu_target, "steady_heap", lambda *a, **k: pytest.fail("the heap was replayed again"))
    reused = estimate(zoo("tiny_gpt"), batch_size=2)
    assert reused == stored == fresh and reused.process_bytes_high == fresh.process_bytes_high
    monkeypatch.undo()
    (path,) = cache_on.glob("*" + cache_store.RESULT_SUFFIX)  # a damaged heap file: replayed again, the same figures
    data = json.loads(gzip.decompress(path.read_bytes()))
    data["result"]["resident"] = "many"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert estimate(zoo("tiny_gpt"), batch_size=2) == fresh
    assert estimate(zoo("tiny_gpt"), batch_size=2, run_steps=4) == estimate(zoo("tiny_gpt"), batch_size=2, run_steps=4,
                                                                             cache=False)


def test_fit_predicts_with_the_cache_on(cache_on):
    """Two traces' cache keys differ; the batch prediction must not read that as traces that differ (it sent every
    fit to tracing each candidate), and a second fit gives the first's answer from the cache."""
    from trainmem import fit

    first = fit("mlp:10-5", device="a100-40gb", limit=1 << 12)
    assert first.search["how"].startswith("predicted from the traces at batch 1 and 2"), first.search
    again = fit("mlp:10-5", device="a100-40gb", limit=1 << 12)
    assert (again.best, again.first_miss, again.tried) == (first.best, first.first_miss, first.tried)
    assert again.to_dict() == first.to_dict()


@pytest.mark.heavy
def test_an_hf_model_asked_again_is_answered_without_transformers(tmp_path):
    """trace/early_key.py: a run of an `hf:` model keeps what names its trace before the model is built; asked again,
    the answer comes from the cache without importing transformers or building, byte for byte the same. A changed
    config.json, setup or --no-cache is not answered from it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((TINY_LLAMA / "config.json").read_text())
    code = ("import sys, json; from trainmem import estimate\n"
            "est = estimate(sys.argv[1], batch_size=2, seq_len=16, device='a100-40gb', cache=sys.argv[2] == 'on')\n"
            "print(json.dumps([est.allocated_bytes, est.trace_cache.used, 'transformers' in sys.modules]))")

    def run(ref, cache="on"):
        done = subprocess.run([sys.executable, "-c", code, ref, cache], capture_output=True, text=True, timeout=300,
                              env={**__import__("os").environ, "TRAINMEM_CACHE_DIR": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    first, second = run(f"hf:{model}"), run(f"hf:{model}")
    assert first[1:] == ["stored", True] and second[1:] == ["reused", False] and first[0] == second[0]
    assert run(f"hf:{model}", cache="off")[1:] == ["off", True]
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    changed = run(f"hf:{model}")
    assert changed[1:] == ["stored", True] and changed[0] > first[0]
