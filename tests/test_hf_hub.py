"""hf:owner/name[@revision] through huggingface_hub's own hf_hub_download, with no network: a cache laid out
as the hub's (models--owner--name/{blobs,refs,snapshots}), HF_HUB_OFFLINE, and the hub's HTTP answers
(gated, not found, a real download, the network down) from an in-process httpx transport put in through
huggingface_hub.set_client_factory. Hostile hf: references through the CLI: exit 2, one line, no
traceback, bounded time and memory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")
httpx2 = pytest.importorskip("httpx2")  # the HTTP client this huggingface_hub uses (set_client_factory)

from trainmem import estimate  # noqa: E402
from trainmem.errors import ModelRefError  # noqa: E402
from trainmem.frontends import hf_hub  # noqa: E402
from trainmem.frontends.hf import bundled, checked_config, from_hf_ref, resolve_config  # noqa: E402
from trainmem.frontends.hf_config_checks import MAX_LAYERS  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPO = "tiny-org/tiny-llama"
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "torch_dtype": "bfloat16", "transformers_version": "4.57.0"}
# embeddings and head 2 × 1000 × 128; per layer q,o 128², k,v 128×64, gate/up/down 3 × 128×256, 2 norms 128
PARAMS = 2 * 1000 * 128 + 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128) + 128
PER_LAYER = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128
MAIN = "1c7e3b0f5a9d2e4c6b8a0f1e3d5c7b9a2e4f6a8c"  # commit hashes, 40 hex digits as the hub's
TAGGED = "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"


def git_blob_sha(data: bytes) -> str:
    """The hub names a small file's blob by its git object id, as `git hash-object` does."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache_repo(cache: Path, repo_id: str, files: dict[str, bytes], commit: str, refs: tuple[str, ...] = ("main",)):
    """Lay out one snapshot as hf_hub_download leaves it: blobs/<etag>, snapshots/<commit>/<name> a relative
    symlink to the blob, refs/<branch or tag> holding the commit."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    for name, data in files.items():
        blob = folder / "blobs" / git_blob_sha(data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = folder / "snapshots" / commit / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    for ref in refs:
        (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return folder


def config_bytes(**changes) -> bytes:
    return json.dumps({**TINY, **changes}).encode()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty hub cache, offline; constants are patched for this process and the environment is set for
    child processes (huggingface_hub reads it at import)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hf_hub._FETCHED.clear()
    yield cache
    hf_hub._FETCHED.clear()


class FakeHub:
    """The hub's HTTP answers for config.json, through the client huggingface_hub itself uses: HEAD gives
    the commit, ETag and size; GET the bytes. `errors[repo] = (status, X-Error-Code)` answers an error."""

    def __init__(self):
        self.files: dict[tuple[str, str], tuple[str, bytes]] = {}  # (repo, revision) -> (commit, bytes)
        self.errors: dict[str, tuple[int, str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.down = False
        self.claimed_size: int | None = None

    def handle(self, request):
        self.requests.append((request.method, str(request.url)))
        if self.down:
            raise httpx2.ConnectError("[Errno -2] Name or service not known", request=request)
        _, owner, name, _, revision, *_ = request.url.path.split("/")
        repo = f"{owner}/{name}"
        if repo in self.errors:
            status, code = self.errors[repo]
            return httpx2.Response(status, headers={"X-Error-Code": code, "X-Error-Message": code}, request=request)
        if (repo, revision) not in self.files:
            return httpx2.Response(404, headers={"X-Error-Code": "RevisionNotFound"}, request=request)
        commit, data = self.files[(repo, revision)]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha(data)}"',
                   "Content-Length": str(self.claimed_size or len(data))}
        return httpx2.Response(200, headers=headers, content=b"" if request.method == "HEAD" else data,
                               request=request)


@pytest.fixture
def online(hub, monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(fake.handle),
                                                             follow_redirects=True))
    yield fake
    huggingface_hub.set_client_factory(huggingface_hub.utils._http.default_client_factory)


# --- the cache, offline: the real hf_hub_download -------------------------------------------------------------

@pytest.mark.heavy
def test_estimate_from_the_hub_cache_is_the_local_files_estimate(hub, tmp_path):
    cache_repo(hub, REPO, {"config.json": config_bytes()}, MAIN)
    est = estimate(f"hf:{REPO}", batch_size=2, seq_len=32)
    assert est.parameters == PARAMS and est.model_name == f"{REPO} (causal-lm)"
    assert est.resolved["config"] == {"from": "hub-cache", "repo": REPO, "revision": "main", "commit": MAIN,
                                      "path": str(hub / f"models--tiny-org--tiny-llama/snapshots/{MAIN}/config.json")}
    note = next(w for w in est.warnings if "config.json from the hub cache" in w)
    assert f"({REPO}, revision main, commit {MAIN[:12]})" in note
    # the checkpoint's dtype is dropped, as the bundled table drops it: parameters train in --precision (fp32)
    assert "config.json's torch_dtype bfloat16: how the checkpoint was saved, not how it trains; ignored " \
        "(--precision and --qlora say that)" in est.warnings
    assert est.breakdown["parameters"] == 4 * PARAMS
    local = tmp_path / "local"
    local.mkdir()
    (local / "config.json").write_bytes(config_bytes())
    same = estimate(f"hf:{local}", batch_size=2, seq_len=32)
    assert (same.tensor_bytes, same.breakdown) == (est.tensor_bytes, est.breakdown)
    assert same.resolved["config"] == {"from": "local", "path": str(local / "config.json")}


def test_a_revision_names_a_tag_or_a_commit(hub):
    cache_repo(hub, REPO, {"config.json": config_bytes()}, MAIN)
    cache_repo(hub, REPO, {"config.json": config_bytes(num_hidden_layers=5)}, TAGGED, refs=("v2",))
    setup = TrainingSetup(seq_len=16)
    assert resolve_config(REPO).values["num_hidden_layers"] == 2
    for revision in ("v2", TAGGED):
        resolved = resolve_config(f"{REPO}@{revision}")
        assert resolved.values["num_hidden_layers"] == 5
        assert resolved.origin_fields["commit"] == TAGGED and resolved.origin_fields["revision"] == revision
    import torch

    with torch.device("meta"):
        deeper = from_hf_ref(f"hf:{REPO}@v2", setup).build()
    assert sum(p.numel() for p in deeper.parameters()) == PARAMS + 3 * PER_LAYER
    with pytest.raises(ModelRefError, match="HF_HUB_OFFLINE is set and tiny-org/tiny-llama@v3's config.json"):
        resolve_config(f"{REPO}@v3")


def test_offline_and_not_cached_falls_back_to_the_bundled_table_and_says_so(hub):
    resolved = resolve_config("openai-community/gpt2@main")
    assert resolved.origin_fields["from"] == "bundled"
    assert resolved.origin.startswith("HF_HUB_OFFLINE is set and openai-community/gpt2@main's config.json is not in "
                                      "the hub cache")
    assert "config.json from trainmem's bundled table (a copy of https://huggingface.co/openai-community/gpt2" \
        in resolved.origin
    # a bundled name without a revision never asks the hub: the table answers, the same everywhere
    plain = resolve_config("gpt2")
    assert plain.origin.startswith("config.json from trainmem's bundled table") and plain.values == resolved.values
    # an alias with a revision asks the hub for the repository the table names
    assert resolve_config("gpt2@main").origin.startswith("HF_HUB_OFFLINE is set and openai-community/gpt2@main's")


def test_offline_not_cached_not_bundled_is_one_line(hub):
    with pytest.raises(ModelRefError) as error:
        resolve_config("someone/unheard-of-7b")
    message = str(error.value)
    assert message.startswith("hf:someone/unheard-of-7b: HF_HUB_OFFLINE is set and someone/unheard-of-7b@main's "
                              "config.json is not in the hub cache")
    assert "unset HF_HUB_OFFLINE" in message and "not in the bundled table" in message and "\n" not in message


def test_custom_code_is_refused_without_trust_remote_code(hub):
    custom = {**TINY, "model_type": "tiny-custom", "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig",
                                                                 "AutoModelForCausalLM": "modeling_tiny.TinyLM"}}
    cache_repo(hub, "someone/custom", {"config.json": json.dumps(custom).encode()}, MAIN)
    with pytest.raises(ModelRefError, match=r"names the repository's own code \(AutoConfig → configuration_tiny"
                                            r".TinyConfig, .*rerun with --trust-remote-code"):
        from_hf_ref("hf:someone/custom", TrainingSetup())
    # a model_type transformers knows too: the model card's code may differ from transformers' own classes
    known = {**TINY, "auto_map": custom["auto_map"]}
    cache_repo(hub, "someone/known", {"config.json": json.dumps(known).encode()}, MAIN)
    with pytest.raises(ModelRefError, match=r"^hf:someone/known: expected a config without custom code, got auto_map "
                                            r"naming the repository's own \(AutoConfig → .*\); rerun with "
                                            r"--trust-remote-code to download and run it, or give a copy of config.json "
                                            r"without auto_map for transformers' own llama$"):
        from_hf_ref("hf:someone/known", TrainingSetup())
    # a tokenizer's classes are not the model's: built with transformers' own
    tokenizer_only = {**TINY, "auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}}
    cache_repo(hub, "someone/tokenizer-code", {"config.json": json.dumps(tokenizer_only).encode()}, MAIN)
    assert from_hf_ref("hf:someone/tokenizer-code", TrainingSetup()).name == "someone/tokenizer-code (causal-lm)"


def test_seq_len_beyond_learned_positions_is_refused():
    import torch

    from trainmem.errors import SetupError

    with torch.device("meta"):
        assert from_hf_ref("hf:gpt2", TrainingSetup(seq_len=1024)).build() is not None
        with pytest.raises(SetupError, match=r"^--seq-len: expected --seq-len of at most 1024 \(the model's learned "
                                             r"positions, transformer.wpe\), got 1025$"):
            from_hf_ref("hf:gpt2", TrainingSetup(seq_len=1025)).build()
        # RoBERTa's positions start after its padding index: 514 rows, 512 positions
        with pytest.raises(SetupError, match="at most 512 .*roberta.embeddings.position_embeddings"):
            from_hf_ref("hf:roberta-base", TrainingSetup(seq_len=513)).build()
        # rotary positions have no table: longer sequences run (as they do for real)
        assert from_hf_ref(f"hf:{ROOT / 'tests/data/tiny_llama'}", TrainingSetup(seq_len=4096)).build() is not None
    # fit --max-seq searches up to the same limit: the table's positions, else the config's
    from trainmem.frontends.hf import max_sequence_length

    assert [max_sequence_length(name) for name in ("roberta-base", "gpt2", str(ROOT / "tests/data/tiny_llama"))] == \
        [512, 1024, 256]


TINY_CODE = {
    "configuration_tiny.py": b'''from transformers import PretrainedConfig


class TinyConfig(PretrainedConfig):
    model_type = "tiny-custom"

    def __init__(self, vocab_size=10, hidden_size=4, num_hidden_layers=1, **kwargs):
        self.vocab_size, self.hidden_size, self.num_hidden_layers = vocab_size, hidden_size, num_hidden_layers
        super().__init__(**kwargs)
''',
    "modeling_tiny.py": b'''import torch
from transformers import PreTrainedModel

from .configuration_tiny import TinyConfig


class TinyLM(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(config.hidden_size, config.hidden_size)
                                          for _ in range(config.num_hidden_layers))
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids, labels=None):
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = torch.relu(layer(hidden))
        logits = self.head(hidden)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}
'''}


@pytest.mark.heavy
def test_trust_remote_code_runs_the_repositorys_code_from_the_cache(hub, tmp_path):
    custom = {"model_type": "tiny-custom", "architectures": ["TinyLM"], "vocab_size": 50, "hidden_size": 8,
              "num_hidden_layers": 3, "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig",
                                                   "AutoModelForCausalLM": "modeling_tiny.TinyLM"}}
    cache_repo(hub, "someone/custom", {"config.json": json.dumps(custom).encode(), **TINY_CODE}, MAIN)
    # through the CLI, in a child process: the repository's modules are imported into it (HF_MODULES_CACHE)
    code, out, err, _, _ = _run_cli(["estimate", "hf:someone/custom", "--seq-len", "8", "--batch-size", "2",
                                     "--trust-remote-code", "--format", "json"], tmp_path, wall_s=300)
    assert code == 0, err
    report = json.loads(out)
    assert report["model"]["parameters"] == 50 * 8 + 3 * (8 * 8 + 8) + 8 * 50
    assert "--trust-remote-code: built with the repository's own code from someone/custom" in report["warnings"]
    # the batch the model was trained on: token ids below its vocabulary, labels beside them
    assert [tensor["shape"] for tensor in report["setup"]["resolved"]["inputs"]["tensors"]] == [[2, 8], [2, 8]]


# --- the hub's HTTP answers, from an in-process transport ---------------------------------------------------

def test_a_download_goes_into_the_cache_and_is_found_there_offline(online, hub, monkeypatch):
    online.files[(REPO, "main")] = (MAIN, config_bytes())
    first = resolve_config(REPO)
    assert first.origin == f"config.json downloaded from the hub ({REPO}, revision main, commit {MAIN[:12]})"
    assert first.origin_fields["from"] == "hub" and first.values["num_hidden_layers"] == 2
    assert all(url.endswith(f"{REPO}/resolve/main/config.json") for _, url in online.requests)  # never weights
    hf_hub._FETCHED.clear()
    assert resolve_config(REPO).origin.startswith("config.json from the hub cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    hf_hub._FETCHED.clear()
    assert resolve_config(REPO).origin_fields == {**first.origin_fields, "from": "hub-cache"}


def test_gated_repository_says_set_hf_token(online):
    online.errors["meta-private/secret-model"] = (401, "GatedRepo")
    with pytest.raises(ModelRefError, match=r"^hf:meta-private/secret-model: meta-private/secret-model is gated: "
                                            r"accept its terms on https://huggingface.co/meta-private/secret-model "
                                            r"and set HF_TOKEN to a token that has access; .*not in the bundled"):
        resolve_config("meta-private/secret-model")
    # a gated repository the table holds: its bundled copy, and why
    online.errors["meta-llama/Llama-3.1-8B"] = (401, "GatedRepo")
    resolved = resolve_config("meta-llama/Llama-3.1-8B@main")
    assert resolved.origin_fields["from"] == "bundled" and resolved.origin.startswith("meta-llama/Llama-3.1-8B is gated")


def test_missing_repository_is_one_line(online):
    online.errors["nobody/nothing"] = (404, "RepoNotFound")
    with pytest.raises(ModelRefError, match=r"^hf:nobody/nothing: no repository nobody/nothing on the hub \(or it is "
                                            r"private: set HF_TOKEN\); nobody/nothing is not in the bundled table"):
        resolve_config("nobody/nothing")
    online.files[(REPO, "main")] = (MAIN, config_bytes())
    with pytest.raises(ModelRefError, match=r"no revision 'nope' in tiny-org/tiny-llama"):
        resolve_config(f"{REPO}@nope")
    online.errors["someone/weights-only"] = (404, "EntryNotFound")
    with pytest.raises(ModelRefError, match=r"someone/weights-only has no config.json at main \(not a transformers"):
        resolve_config("someone/weights-only")


def test_an_oversized_config_is_refused_before_it_is_downloaded(online):
    online.files[(REPO, "main")] = (MAIN, config_bytes())
    online.claimed_size = hf_hub.MAX_CONFIG_BYTES + 1
    with pytest.raises(ModelRefError, match=r"expected a config.json of at most 4,194,304 bytes, got one of "
                                            r"4,194,305 bytes"):
        resolve_config(REPO)
    assert [method for method, _ in online.requests] == ["HEAD"]


def test_network_down_uses_the_cache_or_says_why(online, hub):
    online.down = True
    cache_repo(hub, REPO, {"config.json": config_bytes()}, MAIN)
    assert resolve_config(REPO).origin.startswith("config.json from the hub cache")
    with pytest.raises(ModelRefError, match=r"the hub could not be reached \(ConnectError: .*\) and "
                                            r"someone/elsewhere@main's config.json is not in the hub cache"):
        resolve_config("someone/elsewhere")
    assert len(online.requests) == 2  # one HEAD each, no retries


def test_cached_file_over_the_limit_is_refused(hub):
    cache_repo(hub, REPO, {"config.json": b" " * hf_hub.MAX_CONFIG_BYTES + config_bytes()}, MAIN)
    with pytest.raises(ModelRefError, match="expected a config.json of at most 4,194,304 bytes"):
        resolve_config(REPO)


def test_a_quantized_checkpoints_config_trains_as_the_setup_says(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": {"quant_method": "fp8",
                                                                                      "weight_block_size": [128, 128]}}))
    source = from_hf_ref(f"hf:{tmp_path}", TrainingSetup(seq_len=8))
    assert "config.json's torch_dtype bfloat16, quantization_config fp8: how the checkpoint was saved, not how it " \
        "trains; ignored (--precision and --qlora say that)" in source.notes
    import torch

    with torch.device("meta"):
        model = source.build()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert sum(p.numel() for p in model.parameters()) == PARAMS


def test_a_4bit_checkpoints_config_names_the_qlora_flags(tmp_path):
    """A pre-quantized bitsandbytes checkpoint (an unsloth-style *-bnb-4bit repository) says in its config how it was
    quantized; the note turns that into the flags that estimate fine-tuning it: an absent compute dtype is
    BitsAndBytesConfig's default, fp32."""
    saved = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
             "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
    for config, flags in ((saved, "--qlora --bnb-quant nf4-dq --bnb-compute-dtype bf16"),
                          ({**saved, "bnb_4bit_use_double_quant": False, "bnb_4bit_compute_dtype": None},
                           "--qlora --bnb-quant nf4"),
                          ({key: value for key, value in saved.items() if key != "bnb_4bit_compute_dtype"},
                           "--qlora --bnb-quant nf4-dq --bnb-compute-dtype fp32")):
        (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": config}))
        notes = " ".join(from_hf_ref(f"hf:{tmp_path}", TrainingSetup(seq_len=8)).notes)
        assert f"quantization_config bitsandbytes 4-bit (fine-tuning it is QLoRA: {flags})" in notes, notes
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": {**saved, "load_in_4bit": False,
                                                                                      "load_in_8bit": True}}))
    assert "quantization_config bitsandbytes:" in " ".join(from_hf_ref(f"hf:{tmp_path}", TrainingSetup(seq_len=8)).notes)


def test_the_limits_keep_every_bundled_config_and_refuse_one_layer_more():
    for name, entry in bundled().items():
        assert checked_config({"model_type": entry["model_type"], **entry["config"]}, name)
    assert checked_config({**TINY, "num_hidden_layers": MAX_LAYERS}, "config.json")["num_hidden_layers"] == MAX_LAYERS
    with pytest.raises(ModelRefError, match=f"config.json: num_hidden_layers: expected at most {MAX_LAYERS} layers"):
        checked_config({**TINY, "num_hidden_layers": MAX_LAYERS + 1}, "config.json")
    with pytest.raises(ModelRefError, match="text_config.n_layer: expected at most"):
        checked_config({**TINY, "text_config": {"n_layer": 10**5}}, "config.json")


# rotary settings as released configs write them: each must pass (a refusal here would refuse a real model)
RELEASED_ROPES = [
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
     "rope_type": "llama3"},  # Llama 3.1
    {"type": "longrope", "long_factor": [1.0, 1.2], "short_factor": [1.0, 1.0]},  # Phi-3.5
    {"type": "su", "long_factor": [1.0, 1.2], "short_factor": [1.0, 1.0]},  # Phi-3's first configs
    {"type": "mrope", "mrope_section": [16, 24, 24]},  # Qwen2-VL
    {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
     "original_max_position_embeddings": 4096},  # DeepSeek-V3
    {"type": "dynamic", "factor": 2.0}, {"rope_type": "linear", "factor": 8.0},  # Falcon, Gemma 3
    {"full_attention": {"rope_type": "default", "rope_theta": 1e6},  # transformers 5: one per layer type
     "sliding_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4}},
    {"full_attention": None, "sliding_attention": {"rope_type": "default"}}, None, {},
]


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_released_rope_settings_pass(key):
    for rope in RELEASED_ROPES:
        assert checked_config({**TINY, key: rope, "rope_theta": 5e5, "partial_rotary_factor": 0.5}, "config.json")
    # a repository's own code may read its own types: only transformers' classes are held to transformers' types
    assert checked_config({**TINY, "auto_map": {"AutoModelForCausalLM": "modeling_x.X"},
                           key: {"type": "its-own", "factor": 2.0}}, "config.json")


@pytest.mark.parametrize("changes, where, words", [
    ({"head_dim": 0}, "head_dim", "positive whole number"),
    ({"text_config": {"head_dim": -8}}, "text_config.head_dim", "positive whole number"),
    ({"max_position_embeddings": 0}, "max_position_embeddings", "positive whole number"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "divisor of num_attention_heads (4)"),
    ({"rope_theta": 0}, "rope_theta", "above 0"),
    ({"partial_rotary_factor": 2}, "partial_rotary_factor", "from 0 to 1"),
    ({"rope_scaling": "linear"}, "rope_scaling", "an object such as"),
    ({"rope_scaling": {"type": "warp", "factor": 2.0}}, "rope_scaling.type", "got 'warp'"),
    ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling.factor", "factor for rope type 'linear', got none"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": None}}, "rope_scaling.factor", "got null"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -1}}, "rope_scaling.factor", "above 0"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": "2"}}, "rope_scaling.factor", "above 0, got the string"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
     "rope_scaling.high_freq_factor", "high_freq_factor for rope type 'llama3'"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": "x"}}, "rope_scaling.long_factor",
     "list of numbers"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "warp"}}},
     "rope_parameters.sliding_attention.rope_type", "got 'warp'"),
])
def test_bad_sizes_and_rope_settings_name_the_key(changes, where, words):
    with pytest.raises(ModelRefError) as error:
        checked_config({**TINY, **changes}, "model/config.json")
    assert error.value.where == f"model/config.json: {where}" and words in error.value.message, str(error.value)


# --- hostile hf: references through the CLI -------------------------------------------------------------------

def _write(tmp: Path, name: str, content: str | bytes) -> str:
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _nested(depth: int) -> str:
    return json.dumps({**TINY, "rope_scaling": json.loads('{"a":' * depth + "1" + "}" * depth)})


HOSTILE = [  # (id, reference or a function of the temporary directory, a fragment of the one line)
    ("empty", "hf:", "expected a model after hf:"),
    ("spaces", "hf:   ", "expected a model after hf:"),
    # as many ../ as it takes from the repository root (the CLI's working directory) to reach /etc/passwd,
    # wherever the checkout lies
    ("dot-dot-passwd", lambda _: "hf:" + os.path.relpath("/etc/passwd", ROOT),
     "expected a JSON config.json, could not parse it"),
    ("absolute-passwd", "hf:/etc/passwd", "expected a JSON config.json, could not parse it"),
    ("missing-path", "hf:./no/such/config.json", "expected an existing directory or config.json"),
    ("three-parts", "hf:a/b/c", "expected an existing directory or config.json"),
    ("dev-zero", "hf:/dev/zero", "expected"),
    ("long-name", "hf:" + "x" * 5000, "expected a bundled model name"),
    ("dash-dash", "hf:owner--x/name", "expected a bundled model name"),
    ("bad-revision", "hf:owner/name@../../x", "expected a revision after @"),
    ("empty-revision", "hf:owner/name@", "expected a revision after @"),
    ("not-json", lambda t: "hf:" + _write(t, "config.json", "model_type: llama"), "could not parse it"),
    ("binary", lambda t: "hf:" + _write(t, "config.json", bytes(range(256))), "could not parse it"),
    ("array", lambda t: "hf:" + _write(t, "config.json", "[1, 2, 3]"), "got a JSON array"),
    ("string", lambda t: "hf:" + _write(t, "config.json", '"llama"'), "got a JSON string"),
    ("huge", lambda t: "hf:" + _write(t, "config.json", b'{"model_type": "llama", "pad": "' + b"x" * (5 << 20) + b'"}'),
     "at most 4,194,304 bytes"),
    ("no-model-type", lambda t: "hf:" + _write(t, "config.json", '{"hidden_size": 8}'), "model_type string"),
    ("model-type-list", lambda t: "hf:" + _write(t, "config.json", '{"model_type": ["llama"]}'), "got array"),
    ("model-type-null", lambda t: "hf:" + _write(t, "config.json", '{"model_type": null}'), "got null"),
    ("model-type-number", lambda t: "hf:" + _write(t, "config.json", '{"model_type": 7}'), "got number 7"),
    ("unknown-type", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "model_type": "lama"})),
     "nearest: llama"),
    ("huge-type-name", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "model_type": "q" * 100000})),
     "characters)"),
    ("layers-100000", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "num_hidden_layers": 100000})),
     f"expected at most {MAX_LAYERS:,} layers"),
    ("decoder-layers", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "model_type": "t5",
                                                                              "num_decoder_layers": 5000})),
     "num_decoder_layers: expected at most"),
    ("negative-layers", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "num_hidden_layers": -1})),
     "expected a whole number of layers from 0 to 256, got -1"),
    ("float-layers", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "num_hidden_layers": 1e5})),
     "expected a whole number of layers"),
    ("text-layers", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "n_layer": "many"})),
     "n_layer: expected a whole number of layers"),
    ("seq-len-beyond-positions", lambda t: "hf:" + _write(t, "config.json", json.dumps(
        {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 4, "vocab_size": 128})),
     "--seq-len: expected --seq-len of at most 4"),
    ("depths-sum", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "depths": [600, 600]})),
     "got 1,200"),
    ("experts", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "num_local_experts": 10**6})),
     "experts"),
    ("beyond-int64", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "hidden_size": 10**30})),
     "within int64"),
    ("negative-heads", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "num_attention_heads": 0})),
     "expected"),
    ("nan", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "rope_theta": float("nan")})),
     "NaN is not a number a config can hold"),
    ("infinity", lambda t: "hf:" + _write(t, "config.json", '{"model_type": "llama", "hidden_size": -Infinity}'),
     "-Infinity is not a number"),
    ("deep-dicts", lambda t: "hf:" + _write(t, "config.json", _nested(40)), "nested at most 32 deep"),
    ("depth-bomb", lambda t: "hf:" + _write(t, "config.json", "[" * 200000 + "]" * 200000), "nested at most"),
    ("auto-map-bad", lambda t: "hf:" + _write(t, "config.json", json.dumps({**TINY, "auto_map": [1]})),
     "expected auto_map"),
    ("custom-code", lambda t: "hf:" + _write(t, "config.json", json.dumps(
        {**TINY, "model_type": "brand-new", "auto_map": {"AutoModelForCausalLM": "modeling_x.X"}})),
     "--trust-remote-code"),
    ("dir-without-config", lambda t: "hf:" + str(t), "expected a directory with a config.json"),
    ("offline-unknown-repo", "hf:someone/unheard-of-7b", "HF_HUB_OFFLINE is set"),
]
WALL_S = 60  # seconds per refused reference: importing torch and transformers is most of it on a shared CPU
RSS_BYTES = 1500 * 2**20  # a refused reference allocates nothing for real: the interpreter, torch, transformers


@pytest.mark.heavy
@pytest.mark.parametrize("case", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_hf_reference_is_one_line(case, hub, tmp_path):
    _, ref, fragment = case
    ref = ref(tmp_path) if callable(ref) else ref
    code, out, err, elapsed, max_rss = _run_cli(["estimate", ref, "--seq-len", "8"], tmp_path)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("trainmem: error: ") and fragment in err, err
    assert len(err) < 600, err
    assert elapsed < WALL_S and max_rss < RSS_BYTES


def _run_cli(args: list[str], tmp: Path, wall_s: float = 0) -> tuple[int, str, str, float, int]:
    """Run `python -m trainmem ARGS`; its exit code, stdout, stderr, wall seconds and peak RSS (os.wait4's,
    for this child alone)."""
    out_path, err_path = tmp / "cli.out", tmp / "cli.err"
    started = time.monotonic()
    with out_path.open("w") as out, err_path.open("w") as err:
        child = subprocess.Popen([sys.executable, "-m", "trainmem", *args], cwd=ROOT, stdout=out, stderr=err)
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > (wall_s or WALL_S):
            child.kill()
            pid, status, usage = os.wait4(child.pid, 0)
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    return child.returncode, out_path.read_text(), err_path.read_text(), elapsed, usage.ru_maxrss * 1024
