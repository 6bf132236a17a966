"""hf: references (bundled table, a config.json, a directory), tasks and --seq-len; LoRA through peft,
QLoRA's 4-bit base weights, and the Hugging Face Trainer's defaults."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainmem import estimate  # noqa: E402
from trainmem.errors import ModelRefError, SetupError  # noqa: E402
from trainmem.frontends.hf import bundled, find_bundled  # noqa: E402
from trainmem.setup import LoraSpec, TrainingSetup  # noqa: E402

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256}
# embeddings and head 2 × 1000 × 128; per layer q,o 128², k,v 128×64, gate/up/down 3 × 128×256, 2 norms 128
LLAMA_PARAMS = 2 * 1000 * 128 + 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128) + 128


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    return tmp_path


@pytest.mark.heavy
def test_config_dir_and_file(tiny):
    by_dir = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, run_steps=2)  # counts and tensors: no long-run heap
    by_file = estimate(f"hf:{tiny / 'config.json'}", batch_size=2, seq_len=32, run_steps=2)
    assert by_dir.parameters == by_file.parameters == LLAMA_PARAMS
    assert "causal-lm" in by_dir.model_name


def test_bundled_names_match_case_insensitively():
    assert find_bundled("HF-Internal-Nothing") is None
    assert find_bundled("GPT2-XL")[0] == "openai-community/gpt2-xl"
    assert find_bundled("meta-llama/llama-3.1-70b")[0] == "meta-llama/Llama-3.1-70B"
    assert len(bundled()) >= 30


@pytest.mark.heavy
def test_bundled_bert_counts_like_the_hub():
    est = estimate("hf:bert-base-uncased", batch_size=1, seq_len=16, run_steps=2)
    assert est.parameters == 109_514_298  # BertForMaskedLM(bert-base-uncased), decoder tied to the embeddings


@pytest.mark.heavy
def test_seq_len_and_task(tiny):
    short = estimate(f"hf:{tiny}", batch_size=2, seq_len=16, run_steps=2)  # tensors only: no long-run heap replay
    long = estimate(f"hf:{tiny}", batch_size=2, seq_len=128, run_steps=2)
    assert long.tensor_bytes > short.tensor_bytes
    cls = estimate(f"hf:{tiny}", batch_size=2, seq_len=16, task="seq-cls", run_steps=2)
    assert "seq-cls" in cls.model_name and cls.parameters < short.parameters  # a 2-label head, no LM head
    with pytest.raises(SetupError, match="--task"):
        estimate(f"hf:{tiny}", task="translation")


def test_unknown_name_says_what_is_expected():
    with pytest.raises(ModelRefError, match="bundled model name"):
        estimate("hf:no-such-model")


def test_lora_spec_parsing():
    spec = LoraSpec.parse("r=16,alpha=32,targets=q_proj,v_proj,dropout=0.05")
    assert (spec.r, spec.alpha, spec.targets, spec.dropout) == (16, 32, ("q_proj", "v_proj"), 0.05)
    with pytest.raises(SetupError):
        LoraSpec.parse("rank=4")


def test_lora_trains_only_the_adapters(tiny):
    est = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, optimizer="adamw", device="a100-40gb",
                   lora="r=8,alpha=16,targets=q_proj,v_proj")
    # A: [8, 128] and B: [out, 8] for q (out 128) and v (out 64), in each of 2 layers
    assert est.trainable_parameters == 2 * (8 * 128 + 128 * 8 + 8 * 128 + 64 * 8)
    # the model's own count, as its model card gives it; the adapters beside it
    assert (est.parameters, est.adapter_parameters) == (LLAMA_PARAMS, est.trainable_parameters)
    full = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, optimizer="adamw", device="a100-40gb")
    assert est.breakdown["optimizer_state"] < full.breakdown["optimizer_state"] / 20


@pytest.mark.heavy
def test_lora_on_modules_the_model_never_calls():
    """nn.MultiheadAttention reads out_proj's weight directly, so peft's adapter on it never runs: the loss
    reaches nothing trainable, and the user is told which option to change."""
    from conftest import zoo

    with pytest.raises(SetupError, match="--lora targets whose forward the model calls"):
        estimate(zoo("transformer_encoder"), batch_size=2, lora="r=4,targets=out_proj")
    # the same encoder's feed-forward Linear layers are called: they train
    assert estimate(zoo("transformer_encoder"), batch_size=2, lora="r=4,targets=linear1").trainable_parameters == \
        3 * (4 * 128 + 512 * 4)


@pytest.mark.heavy
def test_qlora_stores_base_weights_in_4_bits(tiny):
    est = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, qlora=True, device="a100-40gb")
    setup = est.setup
    assert (setup.optimizer, setup.precision, setup.checkpointing) == ("paged-adamw-8bit", "bf16-mixed", True)
    assert any("4-bit NF4" in w for w in est.warnings)
    linear = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256)  # the quantized weights' values
    fp32 = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, device="a100-40gb", lora="r=64,alpha=16,targets=all-linear")
    # a quantized value takes half a byte instead of 4 (statistics come on top)
    assert fp32.breakdown["parameters"] - est.breakdown["parameters"] > linear * 3


def test_checkpointing_turns_the_key_value_cache_off(tmp_path):
    """Under gradient checkpointing transformers trains with use_cache=False: a cache would be appended to
    again when a layer is recomputed in backward (keys twice as long as the mask, which Gemma-2 refuses)."""
    config = {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "vocab_size": 500, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "sliding_window": 16, "max_position_embeddings": 256, "use_cache": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plain = estimate(f"hf:{tmp_path}", batch_size=2, seq_len=64, device="a100-40gb")
    checkpointed = estimate(f"hf:{tmp_path}", batch_size=2, seq_len=64, device="a100-40gb", checkpointing=True)
    assert checkpointed.breakdown["activations"] < plain.breakdown["activations"]


def test_qlora_leaves_what_transformers_keeps_in_full_precision(tmp_path):
    """T5 lists `wo` in _keep_in_fp32_modules, which transformers' 4-bit quantizer does not convert (nor
    the tied output layer): the stand-in quantizes the same layers."""
    config = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "vocab_size": 300, "d_model": 32,
              "d_kv": 8, "d_ff": 64, "num_layers": 1, "num_decoder_layers": 1, "num_heads": 4,
              "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    est = estimate(f"hf:{tmp_path}", batch_size=2, seq_len=16, qlora=True, device="a100-40gb")
    # linear layers: encoder q,k,v,o + wi; decoder self q,k,v,o, cross q,k,v,o + wi (two wo's stay fp32)
    assert any("QLoRA: 14 linear layers" in w for w in est.warnings)


@pytest.mark.heavy
def test_fit_searches_an_hf_models_sequence_length(tiny):
    """`trainmem fit --max-seq` on an hf: model varies --seq-len, up to the model's position limit."""
    from trainmem.fit import fit

    setup = TrainingSetup.from_mapping({"batch_size": 32, "optimizer": "adam"})
    result = fit(f"hf:{tiny}", setup, "custom:capacity=400MiB,cc=8.0,context=287MB", sequence=True)
    assert result.dimension == "sequence length" and 1 < result.best < result.first_miss == result.best + 1
    assert result.best_estimate.setup.seq_len == result.best and result.best_estimate.fits
    roomy = fit(f"hf:{tiny}", setup, "a100-80gb", sequence=True)
    assert roomy.best == TINY_LLAMA["max_position_embeddings"] and roomy.first_miss is None


def test_lora_without_targets_names_the_layers_to_choose_from(tiny):
    config = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
              "patch_size": 16}
    (tiny / "config.json").write_text(json.dumps(config))
    with pytest.raises(SetupError, match="its linear layers are named projection, q_proj, k_proj, v_proj"):
        estimate(f"hf:{tiny}", batch_size=2, lora="r=4")


def test_hf_trainer_defaults():
    setup = TrainingSetup.from_mapping({"hf_trainer": True})
    from trainmem.trainer_defaults import trainer_optimizer_impl

    # fused from torch 2.8 on, as transformers picks (trainer_defaults.py)
    assert (setup.optimizer, setup.optimizer_impl, setup.max_grad_norm) == ("adamw", trainer_optimizer_impl(), 1.0)
    kept = TrainingSetup.from_mapping({"hf_trainer": True, "optimizer": "sgd"})
    assert kept.optimizer == "sgd"


def test_trainer_default_optimizer_is_what_transformers_says():
    """The constant in setup.py follows the installed transformers' TrainingArguments default."""
    import transformers
    args = transformers.TrainingArguments(output_dir="unused", report_to="none")
    from trainmem.trainer_defaults import trainer_optim_name

    assert str(args.optim.value) == trainer_optim_name()  # adamw_torch_fused from torch 2.8 on
    assert args.max_grad_norm == 1.0


def test_hf_trainer_copies_outputs_to_fp32_under_mixed_precision(tiny):
    kw = dict(batch_size=4, seq_len=128, device="a100-40gb", precision="bf16-mixed", optimizer_impl="fused")
    plain = estimate(f"hf:{tiny}", optimizer="adamw", loop="trainer", **kw)  # --hf-trainer's loop, without the copy
    trainer = estimate(f"hf:{tiny}", hf_trainer=True, **kw)
    assert "_to_copy" in trainer.coverage["ops"]
    assert trainer.tensor_bytes >= plain.tensor_bytes


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"lora": "r=8,alpha=16,targets=q_proj,v_proj,dropout=0.1"}])
def test_cpu_measure_agrees_on_a_hf_model(tiny, extra):
    """The same run for real on this CPU (fresh processes): tensor peak within 1%; peak RSS (the median of
    three runs) within 5% and at most process_bytes_high. This model is one the transformers rows of the
    small-object table were calibrated on (benchmarks/calibrate_small_objects.py), so this holds the calibration
    to its own model; held-out transformers models are benchmarks/hf_cpu_rss.py's. Measured on an AMD EPYC Zen 5
    (2026-12-08): +0.4% and, with LoRA, +1.2% (409 vs 404 MiB; +5.5% with the plain-PyTorch rows it took before)."""
    from trainmem.measure.single_process import measure

    # the LoRA case runs 8 steps rather than the long run (32): a third of the time
    length = {"run_steps": 8} if extra else {}
    setup = TrainingSetup.from_mapping({"batch_size": 4, "seq_len": 128, "optimizer": "adamw", **extra, **length})
    comparison = measure(f"hf:{tiny}", setup, runs=3)
    errors = comparison.to_dict()["error"]
    assert abs(errors["tensor_bytes"]) <= 0.01, comparison
    assert abs(errors["process_bytes"]) <= 0.05, comparison
    assert comparison.estimate.process_bytes_high >= comparison.measured_process_bytes, comparison


@pytest.mark.heavy
def test_mixture_of_experts_routing_rule(tmp_path):
    """transformers' eager experts ask which tokens each expert got (nonzero): a deliberate rule assumes
    balanced routing, and the report says so."""
    config = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 500, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    est = estimate(f"hf:{tmp_path}", batch_size=2, seq_len=32)
    assert any(w.startswith("aten.nonzero: routing balanced") for w in est.warnings)
    assert any("eager experts" in w for w in est.warnings)


@pytest.mark.heavy
def test_qlora_counts_parameters_as_the_model_does(tiny):
    """Under QLoRA `parameters` counts each quantized weight's values (the model's own count), not its packed
    uint8 elements; the 4-bit storage is reported beside it."""
    est = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, qlora=True, device="a100-40gb")
    shapes = 2 * [(128, 128)] * 2 + 2 * [(128, 64)] * 2 + 2 * [(128, 256)] * 3  # q,o; k,v; gate,up,down × 2 layers
    values = sum(a * b for a, b in shapes)
    assert est.parameters == LLAMA_PARAMS and est.adapter_parameters == est.trainable_parameters
    assert est.quantized_parameters == values

    def stored(n):  # bitsandbytes: n/2 packed bytes, a uint8 absmax per 64 values, an fp32 absmax per 256
        blocks = -(-n // 64)  # blocks, a 256-entry fp32 code and an fp32 offset
        return (n + 1) // 2 + blocks + 4 * -(-blocks // 256) + 256 * 4 + 4

    assert est.quantized_storage_bytes == sum(stored(a * b) for a, b in shapes)
    model = est.to_dict()["model"]
    assert (model["parameters"], model["quantized_parameters"]) == (LLAMA_PARAMS, values)
    assert model["adapter_parameters"] == 2 * 64 * (2 * (128 + 128) + 2 * (128 + 64) + 3 * (128 + 256))
    assert model["quantized_storage_bytes"] == est.quantized_storage_bytes
    assert f"{LLAMA_PARAMS:,} parameters + {est.adapter_parameters:,} in LoRA adapters" in str(est)
    assert f"{values:,} of the model's in 4-bit NF4" in str(est)
    plain = estimate(f"hf:{tiny}", batch_size=2, seq_len=32)
    assert plain.to_dict()["model"]["quantized_parameters"] == plain.quantized_storage_bytes == 0


@pytest.mark.heavy
def test_setup_reports_the_values_used(tiny):
    """setup.resolved: the sequence length and task the frontend chose, the batch the step made, the loss,
    LoRA as peft resolved it, torch's optimizer implementation."""
    est = estimate(f"hf:{tiny}", batch_size=2, qlora=True, device="a100-40gb")
    used = est.to_dict()["setup"]["resolved"]
    assert est.setup.seq_len is None and used["seq_len"] == 256 and "capped" in used["seq_len_from"]
    assert used["task"] == "causal-lm"
    assert [(t["name"], t["shape"], t["dtype"]) for t in used["inputs"]["tensors"]] == \
        [("input_ids", [2, 256], "int64"), ("labels", [2, 256], "int64")]
    assert used["loss"]["loss"] == "the model's own"
    lora = used["lora"]
    assert (lora["r"], lora["alpha"], lora["dropout"], lora["adapted_layers"]) == (64, 16, 0.1, 14)
    assert lora["targets"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    typed = estimate(f"hf:{tiny}", batch_size=2, seq_len=32, lora="r=4,targets=q_proj").resolved
    assert (typed["seq_len"], typed["seq_len_from"], typed["lora"]["alpha"], typed["lora"]["adapted_layers"]) == \
        (32, "--seq-len", 4, 2)
    assert typed["optimizer_impl"] == "for-loop"  # torch's default for CPU tensors
    assert estimate(f"hf:{tiny}", batch_size=2, seq_len=32, device="a100-40gb").resolved["optimizer_impl"] == "foreach"


def test_setup_reports_loss_and_inputs_taken_from_a_spec(tmp_path):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"input": [8], "loss": "mse", "layers": [{"linear": {"out_features": 4}}]}))
    est = estimate(str(spec), batch_size=3)
    used = est.to_dict()["setup"]["resolved"]
    assert est.setup.loss is None and est.setup.inputs == ()
    assert used["loss"] == {"loss": "mse", "from": "the model's default loss"}
    assert used["inputs"]["from"] == "the model's default input"
    assert [(t["shape"], t["dtype"]) for t in used["inputs"]["tensors"]] == [([3, 8], "float32")]
    assert "inputs [3, 8] float32 (the model's default input) · loss mse" in str(est)


def test_old_bitsandbytes_keeps_a_4bit_layers_input_as_long_as_the_graph():
    """bitsandbytes before 0.43.2 put MatMul4Bit's input on the context (`ctx.tensors = (A, B)`), not in
    save_for_backward: backward does not release it, so it lives until the graph itself dies (#1270)."""
    import gc
    import weakref

    import torch

    from trainmem.trace.finetune import NF4Linear, bnb_behaviour

    def input_alive_after(version, stage):
        layer = NF4Linear(torch.nn.Linear(8, 4), bnb_behaviour(version))
        x = torch.ones(3, 8, dtype=torch.bfloat16, requires_grad=True)
        y = x * 2  # an intermediate input, as a layer's input is
        alive = weakref.ref(y)
        loss = layer(y).float().sum()
        del y
        if stage == "backward":
            loss.backward()
        else:
            del loss
        gc.collect()
        return alive() is not None

    for stage in ("backward", "graph freed"):
        assert not input_alive_after((0, 45, 0), stage)
    assert input_alive_after((0, 41, 1), "backward")
    assert input_alive_after((0, 43, 1), "backward")
    assert not input_alive_after((0, 43, 1), "graph freed")
    assert not input_alive_after((0, 43, 2), "backward")


def test_bnb_behaviour_follows_the_release():
    from trainmem.trace.finetune import bnb_behaviour

    old = bnb_behaviour((0, 41, 1))
    assert (old.keeps_input, old.fp16_state) == (True, True)
    assert (bnb_behaviour((0, 43, 1)).keeps_input, bnb_behaviour((0, 43, 1)).fp16_state) == (True, False)
    assert not bnb_behaviour((0, 43, 2)).keeps_input
    assert "0.41.1 (--bnb-version)" in old.describe() and "#1270" in old.describe()
    with pytest.raises(SetupError, match="--bnb-version"):
        TrainingSetup(qlora=True, bnb_version="banana")
    with pytest.raises(SetupError, match="--bnb-version"):
        TrainingSetup.from_mapping({"qlora": True, "bnb_version": 0.41})  # a TOML number is not a version
    assert TrainingSetup(qlora=True, bnb_version="0.45.0.dev0").to_dict()["bnb_version"] == "0.45.0.dev0"
    assert "bnb_version" not in TrainingSetup().to_dict() and "bnb_quant" not in TrainingSetup().to_dict()
    with pytest.raises(SetupError, match="--bnb-quant: expected nf4-dq or nf4, got 'fp4'"):
        TrainingSetup(qlora=True, bnb_quant="fp4")
    with pytest.raises(SetupError, match="--bnb-version: expected --qlora beside it"):
        TrainingSetup(bnb_version="0.41.1")  # describes no layer without --qlora


def test_single_quantized_nf4_keeps_an_fp32_absmax_per_block():
    """bitsandbytes quantize_4bit without compress_statistics: the packed values, an fp32 absmax per 64 values and
    the 16-entry NF4 code; with it, a uint8 absmax per block, an fp32 absmax per 256 blocks, the nested state's
    256-entry map and an fp32 offset."""
    import torch

    from trainmem.trace.finetune import NF4Linear, bnb_behaviour

    n = 300 * 200
    blocks = -(-n // 64)
    single = NF4Linear(torch.nn.Linear(200, 300, device="meta"), bnb_behaviour((0, 45, 0), double_quant=False))
    double = NF4Linear(torch.nn.Linear(200, 300, device="meta"), bnb_behaviour((0, 45, 0)))
    assert single.storage_bytes() == n // 2 + 4 * blocks + 16 * 4
    assert double.storage_bytes() == n // 2 + blocks + 4 * -(-blocks // 256) + 256 * 4 + 4


def _weight_sized_outputs(layer, x, autocast: bool) -> list[tuple[str, str, str]]:
    """(phase, op, dtype) of every new tensor of the layer's weight shape made by one forward and backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    shape, made, phase = (layer.out_features, layer.in_features), [], ["forward"]

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            given = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if (isinstance(t, torch.Tensor) and tuple(t.shape) in (shape, shape[::-1]) and t.dim() == 2
                        and t.untyped_storage().data_ptr() not in given):  # new memory, not a view
                    made.append((phase[0], func.__name__.split(".")[0], str(t.dtype).removeprefix("torch.")))
            return out

    with Log(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        y = layer(x)
    phase[0] = "backward"
    with Log():
        y.float().sum().backward()
    return made


def test_bnb_compute_dtype_is_what_each_4bit_layer_dequantizes_to():
    """bitsandbytes' Linear4bit.forward casts the input to bnb_4bit_compute_dtype; MatMul4Bit dequantizes the weight
    in the dtype it was quantized from (the load dtype, bf16 in QLoRA's recipe) and casts it to the input's dtype;
    under autocast F.linear casts it again to the autocast dtype; backward dequantizes and casts to the gradient's
    dtype. BitsAndBytesConfig's default compute dtype is fp32: two weight-sized transients more per use."""
    import torch

    from trainmem.trace.finetune import NF4Linear, bnb_behaviour

    def layer(compute):
        return NF4Linear(torch.nn.Linear(64, 96, bias=False), bnb_behaviour((0, 45, 0), compute=compute))

    x = torch.randn(4, 64, requires_grad=True)
    assert _weight_sized_outputs(layer("bf16"), x, autocast=True) == [
        ("forward", "empty", "bfloat16"), ("backward", "empty", "bfloat16")]
    assert _weight_sized_outputs(layer("fp32"), x, autocast=True) == [
        ("forward", "empty", "bfloat16"), ("forward", "_to_copy", "float32"), ("forward", "_to_copy", "bfloat16"),
        ("backward", "empty", "bfloat16")]
    assert _weight_sized_outputs(layer("fp32"), x, autocast=False) == [
        ("forward", "empty", "bfloat16"), ("forward", "_to_copy", "float32"),
        ("backward", "empty", "bfloat16"), ("backward", "_to_copy", "float32")]
    # the recipe loads in the dtype it computes in: an fp16 run dequantizes to fp16 directly
    assert _weight_sized_outputs(layer("fp16"), x, autocast=False)[0] == ("forward", "empty", "float16")
    from trainmem.trace.finetune import default_compute_dtype

    assert default_compute_dtype(TrainingSetup(qlora=True)) == "bf16"
    assert default_compute_dtype(TrainingSetup(qlora=True, precision="fp16-mixed")) == "fp16"
    with pytest.raises(SetupError, match="--bnb-compute-dtype: expected bf16 or fp16 or fp32, got 'float32'"):
        TrainingSetup(qlora=True, bnb_compute_dtype="float32")
    with pytest.raises(SetupError, match="--bnb-compute-dtype: expected --qlora beside it"):
        TrainingSetup(bnb_compute_dtype="fp32")
    assert "bnb_compute_dtype" not in TrainingSetup().to_dict()


@pytest.mark.heavy
def test_qlora_with_fp32_compute_needs_more(tmp_path):
    """The same QLoRA run with BitsAndBytesConfig's default compute dtype (fp32) holds more at its peak, and the
    report says which compute dtype it assumed. Wide layers and few tokens: the peak is at a dequantized weight;
    under fp32 compute the bf16 dequantized copy and its fp32 cast are alive together (6 B per weight value), under
    bf16 compute one bf16 copy (2 B)."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 2048,
                                                      "vocab_size": 64}))
    runs = {dtype: estimate(f"hf:{tmp_path}", batch_size=1, seq_len=8, qlora=True, device="a100-40gb",
                            bnb_compute_dtype=dtype) for dtype in ("bf16", "fp32")}
    assert runs["fp32"].allocated_bytes > runs["bf16"].allocated_bytes
    assert runs["fp32"].breakdown["temporaries"] >= 512 * 2048 * 6 > runs["bf16"].breakdown["temporaries"]
    for dtype, run in runs.items():
        assert any(w.startswith("QLoRA:") and f"dequantized to {dtype} per use" in w for w in run.warnings)


@pytest.mark.heavy
def test_qlora_with_an_old_bitsandbytes_holds_the_4bit_layers_inputs(tiny):
    """Under checkpointing too: the context attribute is beyond checkpoint's saved-tensor hooks. The extra memory
    is at least one step's down_proj inputs (they always need a gradient under LoRA) and at most two steps'
    inputs of every 4-bit layer (the inline loop keeps the last step's graph through the next forward). Under
    bf16-mixed the hidden states are fp32 and each layer keeps its own bf16 cast (Linear4bit.forward casts x to
    the compute dtype), so q, k and v keep three copies."""
    tokens, layers = 2 * 64, 2
    for checkpointing in (False, True):
        runs = {version: estimate(f"hf:{tiny}", batch_size=2, seq_len=64, qlora=True, device="a100-40gb",
                                  checkpointing=checkpointing, bnb_version=version) for version in ("0.45.0", "0.41.1")}
        extra = runs["0.41.1"].tensor_bytes - runs["0.45.0"].tensor_bytes
        down_inputs = tokens * layers * 256 * 2  # bf16 inputs of down_proj
        every_input = tokens * layers * (3 * 128 + 128 + 2 * 128 + 256) * 2  # q, k, v; o; gate, up; down
        assert down_inputs <= extra <= 2 * every_input, (checkpointing, extra)
        assert any("bitsandbytes 0.41.1 (--bnb-version): keeps each 4-bit layer's input" in w
                   for w in runs["0.41.1"].warnings)


@pytest.mark.heavy
def test_qlora_layers_all_quantizes_the_output_layer_unless_tied(tmp_path):
    """Lightning Fabric's BitsandbytesPrecision (LitGPT's --quantize) converts every nn.Linear, the output layer
    too; transformers' quantizer leaves the output layer out. A tied output layer shares the embeddings and stays."""
    untied = tmp_path / "untied"
    untied.mkdir()
    (untied / "config.json").write_text(json.dumps(TINY_LLAMA))
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text(json.dumps({**TINY_LLAMA, "tie_word_embeddings": True}))

    def quantized(path, **kwargs):
        est = estimate(f"hf:{path}", batch_size=2, seq_len=16, qlora=True, device="a100-40gb", **kwargs)
        return est.quantized_parameters, next(w for w in est.warnings if w.startswith("QLoRA:"))

    layers = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256)
    assert quantized(untied)[0] == layers
    values, note = quantized(untied, qlora_layers="all")
    assert values == layers + 1000 * 128 and "QLoRA: 15 linear layers" in note
    assert quantized(tied, qlora_layers="all")[0] == layers
    with pytest.raises(SetupError, match="--qlora-layers: expected transformers or all"):
        TrainingSetup(qlora=True, qlora_layers="most")


def test_lora_own_adds_no_adapters_and_qlora_quantizes_around_the_models_own():
    """--lora own: the model brings its adapters (LitGPT's lora.GPT): peft adds none, the model's own trainable
    parameters train, and --qlora quantizes the frozen linear layers beside them."""
    assert TrainingSetup(lora="own").lora_spec() is None and TrainingSetup(lora="own", qlora=True).lora_spec() is None
    assert TrainingSetup(qlora=True).lora_spec() is not None
    with pytest.raises(SetupError, match="--lora"):
        TrainingSetup(lora="ownn")

    class WithAdapter(torch.nn.Module):  # a frozen linear layer and a low-rank adapter of its own
        def __init__(self):
            super().__init__()
            self.base = torch.nn.Linear(256, 256)
            self.a = torch.nn.Parameter(torch.zeros(4, 256))
            self.b = torch.nn.Parameter(torch.zeros(256, 4))
            self.base.requires_grad_(False)

        def forward(self, x):
            return self.base(x) + x @ self.a.t() @ self.b.t()

    est = estimate(WithAdapter(), batch_size=4, input_shape="256", lora="own", qlora=True, checkpointing=False,
                   precision="bf16", device="a100-40gb", qlora_layers="all")
    assert est.trainable_parameters == 2 * 4 * 256 and est.quantized_parameters == 256 * 256
    assert any("the model's own adapters (--lora own), 2,048 trainable" in w for w in est.warnings)


def test_qlora_statistics_stay_fp32_in_a_bf16_run():
    """bitsandbytes keeps absmax (and the nested state) in fp32 in the weight's quant state, which a module cast does
    not reach: a pure-bf16 run stores them as an fp32 run does."""
    layer = torch.nn.Linear(4096, 64)
    stored = {}
    for precision in ("bf16", "fp32"):
        for quant in ("nf4", "nf4-dq"):
            model = torch.nn.Sequential(layer, torch.nn.LayerNorm(64))  # the norm trains
            est = estimate(model, batch_size=2, input_shape="4096", lora="own", qlora=True, checkpointing=False,
                           precision=precision, qlora_layers="all", bnb_quant=quant, device="a100-40gb",
                           optimizer="sgd")
            stored[precision, quant] = est.breakdown["buffers"]
    assert stored["bf16", "nf4"] == stored["fp32", "nf4"] > 4096 * 64 // 64 * 4 - 1
    assert stored["bf16", "nf4-dq"] == stored["fp32", "nf4-dq"]
