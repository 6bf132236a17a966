"""Hugging Face models from a configuration, never from weights. `hf:REF` is resolved in this order:

1. a bundled name or alias (frontends/data/hf_configs.json: copies of 34 repositories' config.json, each
   entry naming its source) — answered from the table, without the network, so that these estimates are
   the same everywhere; add `@revision` (e.g. `@main`) to ask the hub instead;
2. a local directory holding config.json, or a config.json path;
3. a hub repository `owner/name[@revision]`: its config.json only, through huggingface_hub (hf_hub.py:
   the hub's cache, HF_HUB_OFFLINE, HF_TOKEN);
4. when the hub cannot answer (offline and not cached, unreachable, gated, unknown) and the table holds
   the name: the bundled copy, with a note saying why.
Otherwise one line says what was tried. The report's notes and `setup.resolved.config` say which source
was used.

Every config.json is hostile until checked (`checked_config`): a JSON object of bounded size and depth,
a string model_type that transformers knows, layer and expert counts within limits, before anything is
built. A config whose `auto_map` names the repository's own Python code for the model (AutoConfig,
AutoModel…) is refused unless the setup's `trust_remote_code` (--trust-remote-code), which downloads and
runs that code as from_pretrained(trust_remote_code=True) does: the estimate must not silently build
another implementation than the one the model card's code runs. Otherwise the model is built with
transformers' `from_config` under the meta device, and trained the way the Trainer does: the batch
carries `labels` and the model computes its own loss. A --seq-len beyond a learned position table
(GPT-2's wpe, BERT's position_embeddings) is refused: on fake tensors the lookup would not fail, for
real it does.

Tasks (`--task`): causal-lm, masked-lm, seq-cls, seq2seq, image-cls, speech-seq2seq (Whisper),
contrastive-image-text (CLIP). `--seq-len` sets the token length (default 512, capped by the model's
positions). Needs `pip install 'trainmem[hf]'` (transformers, which brings huggingface_hub).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, SetupError
from trainmem.frontends import hf_hub
from trainmem.frontends.hf_hub import MAX_CONFIG_BYTES, clip_text
from trainmem.frontends.hf_positions import max_sequence_length as max_sequence_length, within_positions
from trainmem.frontends.hf_config_checks import check_heads, check_number, quantization_summary
from trainmem.frontends.hf_rope import ROPE_KEYS, check_rope

TABLE = Path(__file__).with_name("data") / "hf_configs.json"
DEFAULT_SEQ_LEN = 512
TASKS = ("causal-lm", "masked-lm", "seq-cls", "seq2seq", "image-cls", "speech-seq2seq", "contrastive-image-text")
_AUTO_CLASS = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
               "seq-cls": "AutoModelForSequenceClassification", "seq2seq": "AutoModelForSeq2SeqLM",
               "image-cls": "AutoModelForImageClassification", "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
               "contrastive-image-text": "AutoModel"}
# Nesting of a config's JSON: real ones are 3 deep (text_config.rope_scaling.…); json.loads itself
# stops at Python's recursion limit, but transformers copies and compares configs recursively.
MAX_CONFIG_DEPTH = 32
# Fields of a config.json that describe the checkpoint, not the architecture, dropped as the bundled
# table drops them: the dtype the weights were saved in (training dtypes come from --precision), how they
# were quantized (--qlora describes the training run's quantization), the library version and the path.
CHECKPOINT_FIELDS = ("transformers_version", "_name_or_path", "torch_dtype", "dtype", "quantization_config")


@functools.cache
def bundled() -> dict[str, dict[str, Any]]:
    return json.loads(TABLE.read_text())["models"]


def find_bundled(name: str) -> tuple[str, dict[str, Any]] | None:
    """A bundled entry by hub name or alias, ignoring case."""
    key = name.strip().lower()
    for hub_name, entry in bundled().items():
        if key == hub_name.lower() or key in (a.lower() for a in entry.get("aliases", ())):
            return hub_name, entry
    return None


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ModelRefError("expected transformers for hf: references; install it with "
                            "pip install 'trainmem[hf]'", where="MODEL") from None
    return transformers


@dataclasses.dataclass(frozen=True)
class HfConfig:
    """A checked config.json and where it came from."""

    name: str  # the hub id, or what the user gave
    model_type: str
    default_task: str
    values: dict[str, Any]  # the config without model_type and CHECKPOINT_FIELDS
    origin: str  # one line for the report: which source answered
    origin_fields: dict[str, Any]  # the same for JSON (setup.resolved.config)
    auto_map: dict[str, Any] | None = None  # the repository's own code, by auto class
    code_at: str | None = None  # where that code lives: a hub repository or a local directory
    code_revision: str | None = None
    ignored: tuple[str, ...] = ()  # the dtype and quantization fields the file had, with their values


def resolve_config(text: str) -> HfConfig:
    """The config an `hf:` reference names (the order is in the module's docstring)."""
    if not text.strip():
        raise ModelRefError(f"expected a model after hf: ({_kinds()}), got nothing", where="MODEL")
    found = find_bundled(text) if "@" not in text else None
    if found is not None:
        return _from_bundled(*found)
    local = _local_path(text)
    if local is not None:
        # with --trust-remote-code, transformers reads config.json and the code beside it from the directory
        return _from_file(text, local, f"config.json from the local file {local}", {"from": "local", "path": str(local)},
                          code_at=str(local.parent) if local.name == "config.json" else None)
    repo = hf_hub.parse_repo_ref(text)
    alias, at, revision = text.partition("@")
    if repo is None and at and find_bundled(alias) is not None:  # gpt2@main: the hub id the table names
        repo = hf_hub.parse_repo_ref(f"{find_bundled(alias)[0]}@{revision}")
    if repo is None:
        raise ModelRefError(f"expected {_kinds()}, got {clip_text(text)!r}", where="MODEL")
    repo_id, revision = repo
    try:
        fetched = hf_hub.fetch_config(repo_id, revision)
    except hf_hub.HubUnavailable as why:
        found = find_bundled(repo_id)
        if found is None:
            raise ModelRefError(f"{why}; {repo_id} is not in the bundled table either", where=f"hf:{text}") from None
        return _from_bundled(*found, why_not_the_hub=str(why))
    return _from_file(repo_id, fetched.path, fetched.describe(), fetched.to_dict(), code_at=repo_id,
                      code_revision=fetched.commit or fetched.revision)


def _kinds() -> str:
    return (f"a bundled model name (e.g. gpt2, meta-llama/Llama-3.1-8B; {len(bundled())} in all), a hub repository "
            "owner/name[@revision], a directory with config.json or a config.json path")


def _from_bundled(hub_name: str, entry: dict[str, Any], why_not_the_hub: str = "") -> HfConfig:
    origin = f"config.json from trainmem's bundled table (a copy of {entry['source']})"
    if why_not_the_hub:
        origin = f"{why_not_the_hub}; used {origin} instead"
    return HfConfig(hub_name, entry["model_type"], entry["default_task"], dict(entry["config"]), origin,
                    {"from": "bundled", "source": entry["source"]})


def _local_path(text: str) -> Path | None:
    """The config.json a local path names; None when `text` names nothing local and may be a hub id."""
    try:
        path = Path(text).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelRefError("expected a directory with a config.json, got one without", where=str(path))
            return path / "config.json"
        if path.is_file():
            return path
        if path.exists():  # a device, a pipe, a socket: reading one could block or never end
            raise ModelRefError("expected a directory or a regular config.json file, got another kind of file",
                                where=str(path))
        # a hub id is owner/name[@revision]: anything else path-like is a local path that is not there
        looks_local = (text.startswith((".", "/", "~", "\\")) or text.endswith(".json")
                       or text.partition("@")[0].count("/") > 1)
    except (OSError, ValueError) as error:  # a name too long for the file system, a NUL byte
        reason = error.strerror if isinstance(error, OSError) else str(error)
        raise ModelRefError(f"expected {_kinds()}, got {clip_text(text)!r} ({reason})", where="MODEL") from None
    if looks_local:
        raise ModelRefError(f"expected an existing directory or config.json, got {clip_text(text)!r} (no such file)",
                            where="MODEL")
    return None


def _from_file(name: str, path: Path, origin: str, origin_fields: dict[str, Any], code_at: str | None = None,
               code_revision: str | None = None) -> HfConfig:
    config = checked_config(_read_json(path), str(path))
    model_type = config.pop("model_type")
    auto_map = config.pop("auto_map", None)
    dropped = {key: config.pop(key) for key in CHECKPOINT_FIELDS if key in config}
    ignored = tuple(f"{key} {quantization_summary(value) if key == 'quantization_config' else clip_text(str(value), 40)}"
                    for key, value in dropped.items()
                    if key in ("torch_dtype", "dtype", "quantization_config") and value is not None)
    return HfConfig(name, model_type, _default_task(model_type, config.get("architectures") or []), config, origin,
                    origin_fields, auto_map, code_at if auto_map else None, code_revision, ignored)


def _read_json(path: Path) -> Any:
    """At most MAX_CONFIG_BYTES of the file, parsed; every failure one line."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ModelRefError(f"expected a readable config.json, got {error.strerror or error}", where=str(path)) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ModelRefError(f"expected a config.json of at most {MAX_CONFIG_BYTES:,} bytes (real ones, label tables "
                            "included, are under 2 MB), got a larger file", where=str(path))
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as error:
        raise ModelRefError(f"expected a JSON config.json, could not parse it: {clip_text(str(error), 120)}",
                            where=str(path)) from None
    except RecursionError:
        raise ModelRefError(f"expected a config.json nested at most {MAX_CONFIG_DEPTH} deep, got deeper",
                            where=str(path)) from None


def checked_config(config: Any, where: str) -> dict[str, Any]:
    """A config.json's value, refused unless it is a JSON object whose numbers, layer and expert counts and
    nesting are within the limits of this module and hf_config_checks.py and whose model_type is a string.
    Returns a copy."""
    if not isinstance(config, dict):
        raise ModelRefError(f"expected a JSON object in config.json, got a JSON {_json_kind(config)}", where=where)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.strip():
        got = "none" if "model_type" not in config else f"{_json_kind(model_type)} {clip_text(repr(model_type), 40)}"
        raise ModelRefError(f"expected a config.json with a model_type string (e.g. \"llama\"), got {got}",
                            where=where)
    auto_map = config.get("auto_map")
    if auto_map is not None and not (isinstance(auto_map, dict)
                                     and all(isinstance(v, (str, list)) for v in auto_map.values())):
        raise ModelRefError(f"expected auto_map as an object of class references, got {clip_text(repr(auto_map), 60)}",
                            where=where)
    stack: list[tuple[Any, str, int]] = [(config, "", 1)]
    ropes: list[tuple[Any, str]] = []  # rope_scaling / rope_parameters, checked once the nesting is known bounded
    while stack:  # iterative: a hostile nesting depth cannot exhaust the interpreter's stack here
        value, path, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ModelRefError(f"expected a config.json nested at most {MAX_CONFIG_DEPTH} deep, got deeper at "
                                f"{clip_text(path, 60)}", where=where)
        if isinstance(value, dict):
            check_heads(value, path, where)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            key_path = f"{path}.{key}" if path else str(key)
            if isinstance(item, (dict, list)):
                stack.append((item, key_path, depth + 1))
            if key in ROPE_KEYS and isinstance(value, dict):
                ropes.append((item, key_path))
            check_number(str(key).lower(), item, key_path, where)
    for value, key_path in sorted(ropes, key=lambda rope: rope[1]):
        check_rope(value, key_path, where, own_code=bool(model_code(auto_map)))
    return dict(config)


def _no_constant(name: str) -> None:
    """json.loads takes NaN and Infinity, which no size, rate or count of a real config is."""
    raise ValueError(f"{name} is not a number a config can hold")


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _default_task(model_type: str, architectures: list[str]) -> str:
    special = {"whisper": "speech-seq2seq", "clip": "contrastive-image-text"}  # as the bundled table says
    return special.get(model_type) or _task_from_architectures(architectures)


def _task_from_architectures(architectures: list[str]) -> str:
    name = architectures[0] if architectures and isinstance(architectures[0], str) else ""
    for suffix, task in (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                         ("ForSequenceClassification", "seq-cls"), ("ForConditionalGeneration", "seq2seq"),
                         ("ForImageClassification", "image-cls")):
        if name.endswith(suffix):
            return task
    return "causal-lm"


def model_code(auto_map: dict[str, Any] | None) -> dict[str, Any]:
    """The classes of auto_map that build the model (AutoConfig, AutoModel…); a tokenizer's are not ours."""
    return {key: value for key, value in (auto_map or {}).items() if key == "AutoConfig" or key.startswith("AutoModel")}


def _uses_repository_code(transformers, resolved: HfConfig, trust_remote_code: bool) -> bool:
    """True: the repository's code builds the model (only with trust_remote_code); False: transformers' own
    classes for the model_type. Refuses custom code without the flag and a model_type transformers lacks."""
    code = model_code(resolved.auto_map)
    known = transformers.CONFIG_MAPPING
    version = transformers.__version__
    if code and not trust_remote_code:
        classes = ", ".join(f"{key} → {clip_text(str(value), 40)}" for key, value in list(code.items())[:2])
        if resolved.model_type in known:
            raise ModelRefError(f"expected a config without custom code, got auto_map naming the repository's own "
                                f"({classes}); rerun with --trust-remote-code to download and run it, or give a copy of "
                                f"config.json without auto_map for transformers' own {resolved.model_type}",
                                where=f"hf:{resolved.name}")
        raise ModelRefError(f"expected a model_type transformers {version} knows, got {clip_text(resolved.model_type, 40)!r}, "
                            f"whose config.json names the repository's own code ({classes}); rerun with "
                            "--trust-remote-code to download and run that code", where=f"hf:{resolved.name}")
    if code:
        return True
    if resolved.model_type not in known:
        names = list(known.keys())
        near = difflib.get_close_matches(resolved.model_type.lower(), names, n=3, cutoff=0.6)
        raise ModelRefError(f"expected a model_type transformers {version} knows, got {clip_text(resolved.model_type, 40)!r} "
                            f"({'nearest: ' + ', '.join(near) + '; ' if near else ''}all {len(names)}: python -c "
                            "\"import transformers; print(*transformers.CONFIG_MAPPING)\"; a newer transformers may "
                            "know it)", where=f"hf:{resolved.name}")
    return False


def from_hf_ref(ref: str, setup):
    from trainmem.frontends import ModelSource

    resolved = resolve_config(ref[len("hf:"):].strip())
    name, model_type, config = resolved.name, resolved.model_type, dict(resolved.values)
    task = setup.task or resolved.default_task
    if task not in TASKS:
        raise SetupError(f"expected --task among {', '.join(TASKS)}, got {task!r}", where="--task")
    if task == "speech-seq2seq" and model_type != "whisper" or task == "contrastive-image-text" and model_type != "clip":
        raise SetupError(f"expected --task {task} only for {'whisper' if task == 'speech-seq2seq' else 'clip'} "
                         f"models, got {model_type}", where="--task")
    if task == "seq-cls" and config.get("pad_token_id") is None:
        # decoder models classify from the last non-padding token and need to know the padding id
        eos = config.get("eos_token_id")
        config["pad_token_id"] = (eos[0] if isinstance(eos, list) else eos) or 0
    seq_len = setup.seq_len or min(DEFAULT_SEQ_LEN, max_positions(config) or DEFAULT_SEQ_LEN)
    prekey, native, checked = _checked_before(ref, resolved, setup)
    options, notes = {}, [resolved.origin]
    if resolved.ignored:
        notes.append(f"config.json's {', '.join(resolved.ignored)}: how the checkpoint was saved, not how it trains; "
                     "ignored (--precision and --qlora say that)")
    if not native and resolved.code_at is None:
        raise ModelRefError("expected --trust-remote-code's config as a file named config.json beside the code its "
                            "auto_map names, got another name", where=f"hf:{name}")
    if not native and _AUTO_CLASS[task] not in resolved.auto_map:
        raise ModelRefError(f"expected config.json's auto_map to name {_AUTO_CLASS[task]} for --task {task}, got "
                            f"{clip_text(', '.join(sorted(map(str, resolved.auto_map))), 120)}", where=f"hf:{name}")
    if setup.checkpointing:
        # transformers turns the key/value cache off under gradient checkpointing in training (a cache
        # would be appended to again when a checkpointed layer is recomputed); so do we
        config["use_cache"] = False
    if any(key in config for key in ("num_local_experts", "num_experts")) and setup.precision != "bf16":
        # transformers' default mixture-of-experts kernel (torch grouped_mm) takes only bf16/fp16 weights;
        # with fp32 master weights the experts run as a loop of per-expert matmuls ("eager")
        options["experts_implementation"] = "eager"
        notes.append("fp32 expert weights: transformers' eager experts (grouped_mm needs bf16/fp16 weights)")
    if native:
        if not checked:  # a bad value fails here, on one line
            _native_config(_transformers(), model_type, config, name)
        build = functools.partial(_build_native, name, model_type, config, task, options)
    else:
        notes.append(f"--trust-remote-code: built with the repository's own code from {resolved.code_at}")
        overrides = {key: value for key, value in config.items() if resolved.values.get(key) != value}
        build = functools.partial(_build_remote, resolved, overrides, task, options)

    if task in ("causal-lm", "masked-lm", "seq-cls", "seq2seq"):
        build = functools.partial(within_positions, build, seq_len, setup.seq_len is not None)
    return ModelSource(ref=ref, name=f"{name} ({task})", build=build, prekey=prekey,
                       make_batch=_batch_maker(task, config, seq_len), loss_fn=_model_loss, libraries=("transformers",),
                       resolved={"task": task, "seq_len": seq_len, "seq_len_from": "--seq-len" if setup.seq_len else
                                 f"default {DEFAULT_SEQ_LEN}, capped by the model's position limit",
                                 "config": resolved.origin_fields},
                       notes=(f"hf: {name}: {model_type} built from its config for {task}, sequence length "
                              f"{seq_len}; the model computes its own loss from `labels`, as the Trainer does", *notes))


def _checked_before(ref: str, resolved: HfConfig, setup) -> tuple[str | None, bool, bool]:
    """(the source's early key, whether transformers' own classes build it, whether a run of the same source traced
    before: trace/early_key.py). After such a run transformers accepted the config then and is not imported now;
    else its checks run here (--trust-remote-code is the setup's), with the install hint, not inside the trace."""
    from trainmem.trace import early_key

    prekey = early_key.for_hf(ref, resolved, setup)
    if early_key.checked(prekey):
        return prekey, True, True
    native = not _uses_repository_code(_transformers(), resolved, setup.trust_remote_code)
    return (prekey if native else None), native, False


def _native_config(transformers, model_type: str, config: dict[str, Any], name: str):
    transformers.logging.set_verbosity_error()  # config notices are not ours to print
    try:
        return transformers.AutoConfig.for_model(model_type, **config)
    except Exception as error:  # noqa: BLE001 - a config class rejecting a value: one line, the value named
        # transformers' validators put the reason on the lines after "Class validation error for …:"
        message = " ".join(line.strip() for line in str(error).strip().splitlines()) or type(error).__name__
        raise ModelRefError(f"expected a config transformers' {model_type} accepts, got: {clip_text(message, 200)}",
                            where=f"hf:{name}") from None


def _build_native(name: str, model_type: str, config: dict[str, Any], task: str, options: dict[str, Any]):
    transformers = _transformers()
    hf_config = _native_config(transformers, model_type, config, name)
    auto = getattr(transformers, _AUTO_CLASS[task])
    return auto.from_config(hf_config, **options)


def _build_remote(resolved: HfConfig, overrides: dict[str, Any], task: str, options: dict[str, Any]):
    """The repository's own classes (only with trust_remote_code): transformers fetches the Python files
    auto_map names (hf_hub_download, into HF_MODULES_CACHE) and imports them. `overrides` are the values
    from_hf_ref set (padding id, use_cache); the checkpoint's dtype and quantization are dropped as for
    transformers' own classes."""
    transformers = _transformers()
    transformers.logging.set_verbosity_error()
    auto_name = _AUTO_CLASS[task]
    revision = {"revision": resolved.code_revision} if resolved.code_revision else {}
    hf_config = transformers.AutoConfig.from_pretrained(resolved.code_at, trust_remote_code=True, **revision)
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    for key in ("dtype", "torch_dtype", "quantization_config"):
        if getattr(hf_config, key, None) is not None:
            setattr(hf_config, key, None)
    # what AutoModel…from_config does with trust_remote_code, without its registration in the auto classes
    # (a second build in this process would then take the registered class down another path)
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    class_ref = resolved.auto_map[auto_name]
    class_ref = next((ref for ref in class_ref if ref), "") if isinstance(class_ref, list) else class_ref
    code_at, code_revision = resolved.code_at, resolved.code_revision
    if "--" in class_ref:  # "other/repo--modeling_x.Class": the code lives in another repository
        code_at, class_ref = class_ref.split("--", 1)
        code_revision = None
    model_class = get_class_from_dynamic_module(class_ref, code_at, code_revision=code_revision)
    return model_class._from_config(hf_config, **options)


def max_positions(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_target_positions"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def _batch_maker(task: str, config: dict[str, Any], seq_len: int):
    import torch

    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 49408)
    image = config.get("image_size") or config.get("vision_config", {}).get("image_size", 224)
    channels = config.get("num_channels", 3)

    def make_batch(batch_size: int) -> dict[str, Any]:
        tokens = lambda: torch.randint(0, vocab, (batch_size, seq_len))  # noqa: E731
        if task in ("causal-lm", "masked-lm"):
            ids = tokens()
            return {"input_ids": ids, "labels": ids}
        if task == "seq-cls":
            return {"input_ids": tokens(), "labels": torch.zeros(batch_size, dtype=torch.long)}
        if task == "seq2seq":
            return {"input_ids": tokens(), "labels": tokens()}
        if task == "image-cls":
            return {"pixel_values": torch.randn(batch_size, channels, image, image),
                    "labels": torch.zeros(batch_size, dtype=torch.long)}
        if task == "speech-seq2seq":  # 30 s of audio: num_mel_bins × 3000 frames (WhisperFeatureExtractor)
            frames = 2 * config.get("max_source_positions", 1500)
            return {"input_features": torch.randn(batch_size, config.get("num_mel_bins", 80), frames),
                    "labels": torch.randint(0, vocab, (batch_size, min(seq_len, config.get("max_target_positions", 448))))}
        text_positions = config.get("text_config", {}).get("max_position_embeddings", 77)
        return {"input_ids": torch.randint(0, vocab, (batch_size, min(seq_len, text_positions))),
                "pixel_values": torch.randn(batch_size, 3, image, image), "return_loss": True}

    return make_batch


def _model_loss(output: Any, inputs: Any, *target: Any) -> Any:
    loss = output["loss"] if isinstance(output, dict) or hasattr(output, "keys") else output[0]
    if loss is None:
        raise SetupError("expected the model to return a loss when given labels, it returned none", where="--task")
    return loss
