"""Hugging Face models from a configuration, never from the hub: `hf:NAME` (a bundled table of the hub's
config.json files, frontends/data/hf_configs.json, each entry naming its source), `hf:DIR` or
`hf:path/config.json`. The model is built with transformers' `from_config` under the meta device, and
trained the way the Trainer does: the batch carries `labels` and the model computes its own loss.

Tasks (`--task`): causal-lm, masked-lm, seq-cls, seq2seq, image-cls, speech-seq2seq (Whisper),
contrastive-image-text (CLIP). `--seq-len` sets the token length (default 512, capped by the model's
positions). Needs `pip install 'trainmem[hf]'` (transformers).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, SetupError

TABLE = Path(__file__).with_name("data") / "hf_configs.json"
DEFAULT_SEQ_LEN = 512
TASKS = ("causal-lm", "masked-lm", "seq-cls", "seq2seq", "image-cls", "speech-seq2seq", "contrastive-image-text")
_AUTO_CLASS = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
               "seq-cls": "AutoModelForSequenceClassification", "seq2seq": "AutoModelForSeq2SeqLM",
               "image-cls": "AutoModelForImageClassification", "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
               "contrastive-image-text": "AutoModel"}


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


def _local_config(text: str) -> tuple[str, str, dict[str, Any]]:
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        names = ", ".join(sorted(bundled())[:5])
        raise ModelRefError(f"expected a bundled model name (e.g. {names}; {len(bundled())} in all), a directory "
                            f"with config.json or a config.json path, got {text!r}", where="MODEL")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelRefError(f"expected a JSON config, could not read it: {error}", where=str(path)) from None
    if "model_type" not in config:
        raise ModelRefError("expected a config.json with a model_type", where=str(path))
    config = dict(config)
    model_type = config.pop("model_type")
    task = _task_from_architectures(config.get("architectures") or [])
    return model_type, task, config


def _task_from_architectures(architectures: list[str]) -> str:
    name = architectures[0] if architectures else ""
    for suffix, task in (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                         ("ForSequenceClassification", "seq-cls"), ("ForConditionalGeneration", "seq2seq"),
                         ("ForImageClassification", "image-cls")):
        if name.endswith(suffix):
            return task
    return "causal-lm"


def from_hf_ref(ref: str, setup):
    from trainmem.frontends import ModelSource

    text = ref[len("hf:"):]
    found = find_bundled(text)
    if found is not None:
        name, entry = found
        model_type, default_task, config = entry["model_type"], entry["default_task"], dict(entry["config"])
    else:
        name = text
        model_type, default_task, config = _local_config(text)
    task = setup.task or default_task
    if task not in TASKS:
        raise SetupError(f"expected --task among {', '.join(TASKS)}, got {task!r}", where="--task")
    if task == "speech-seq2seq" and model_type != "whisper" or task == "contrastive-image-text" and model_type != "clip":
        raise SetupError(f"expected --task {task} only for {'whisper' if task == 'speech-seq2seq' else 'clip'} "
                         f"models, got {model_type}", where="--task")
    if task == "seq-cls" and config.get("pad_token_id") is None:
        # decoder models classify from the last non-padding token and need to know the padding id
        eos = config.get("eos_token_id")
        config["pad_token_id"] = (eos[0] if isinstance(eos, list) else eos) or 0
    seq_len = setup.seq_len or min(DEFAULT_SEQ_LEN, _max_positions(config) or DEFAULT_SEQ_LEN)
    _transformers()  # fail here, with the install hint, rather than inside the trace
    options, notes = {}, []
    if setup.checkpointing:
        # transformers turns the key/value cache off under gradient checkpointing in training (a cache
        # would be appended to again when a checkpointed layer is recomputed); so do we
        config["use_cache"] = False
    if any(key in config for key in ("num_local_experts", "num_experts")) and setup.precision != "bf16":
        # transformers' default mixture-of-experts kernel (torch grouped_mm) takes only bf16/fp16 weights;
        # with fp32 master weights the experts run as a loop of per-expert matmuls ("eager")
        options["experts_implementation"] = "eager"
        notes.append("fp32 expert weights: transformers' eager experts (grouped_mm needs bf16/fp16 weights)")

    def build():
        transformers = _transformers()
        transformers.logging.set_verbosity_error()  # config notices are not ours to print
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
        auto = getattr(transformers, _AUTO_CLASS[task])
        return auto.from_config(hf_config, **options)

    return ModelSource(ref=ref, name=f"{name} ({task})", build=build,
                       make_batch=_batch_maker(task, config, seq_len), loss_fn=_model_loss, libraries=("transformers",),
                       resolved={"task": task, "seq_len": seq_len, "seq_len_from": "--seq-len" if setup.seq_len else
                                 f"default {DEFAULT_SEQ_LEN}, capped by the model's position limit"},
                       notes=(f"hf: {name}: {model_type} built from its config for {task}, sequence length "
                              f"{seq_len}; the model computes its own loss from `labels`, as the Trainer does", *notes))


def max_sequence_length(text: str) -> int | None:
    """The longest sequence a bundled name or local config takes (its position limit), or None."""
    found = find_bundled(text)
    config = dict(found[1]["config"]) if found is not None else _local_config(text)[2]
    return _max_positions(config)


def _max_positions(config: dict[str, Any]) -> int | None:
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
