"""Hugging Face models built from their published configurations (no download), as `file.py:factory`
references for the GPU calibration points in benchmarks/data/gpu_published.jsonl. transformers is
imported only when a factory is called. Each factory returns the model, how to make a batch, and the
loss the published run trained with (the model's own head and loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _tokens(vocab: int, seq: int):
    def make_batch(batch_size):
        return (torch.randint(0, vocab, (batch_size, seq)),)
    return make_batch


def _lm_loss(vocab: int, shift: bool):
    def loss_fn(output, inputs, *target):
        logits, labels = output.logits, inputs[0]
        if shift:  # causal LM: predict the next token (GPT2LMHeadModel's loss)
            logits, labels = logits[:, :-1, :], labels[:, 1:]
        return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
    return loss_fn


def _class_loss(output, inputs, *target):
    logits = output.logits
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device))


def bert_base_mlm(seq: int = 16):
    """bert-base-uncased (BertConfig's defaults are its configuration) with the masked-LM head."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()
    return {"model": BertForMaskedLM(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _lm_loss(config.vocab_size, shift=False)}


def gpt2_clm(seq: int = 16):
    """openai-community/gpt2 (GPT2Config's defaults) with the LM head, tied to the embeddings."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    return {"model": GPT2LMHeadModel(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _lm_loss(config.vocab_size, shift=True)}


def roberta_base_multiple_choice(seq: int = 16, choices: int = 1):
    """FacebookAI/roberta-base's configuration (514 positions, one token type, padding id 1)."""
    from transformers import RobertaConfig, RobertaForMultipleChoice

    config = RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)

    def make_batch(batch_size):
        return (torch.randint(3, config.vocab_size, (batch_size, choices, seq)),)
    return {"model": RobertaForMultipleChoice(config), "make_batch": make_batch, "loss_fn": _class_loss}


def vit_base_classification():
    """google/vit-base-patch16-224: 224×224 images, patch 16, the 1000-class ImageNet head."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(num_labels=1000)

    def make_batch(batch_size):
        return (torch.randn(batch_size, 3, 224, 224),)
    return {"model": ViTForImageClassification(config), "make_batch": make_batch, "loss_fn": _class_loss}


def bert_large_classification_eager(seq: int = 512):
    """bert-large-uncased for sequence classification (2 labels), with the eager attention of the
    transformers release the Hugging Face single-GPU training guide measured (v4.21, 2022)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        num_labels=2, attn_implementation="eager")
    return {"model": BertForSequenceClassification(config), "make_batch": _tokens(config.vocab_size, seq),
            "loss_fn": _class_loss}


# huggingface/peft method_comparison/MetaMathQA: meta-llama/Llama-3.2-3B in bf16 with one PEFT method,
# batch 4, sequences padded to the longest in the batch (at most 768 tokens), labels = input_ids (the
# model's own causal-LM loss). The adapter settings below are copied from each result file's peft_config.
PEFT_SEQ = 768  # max_seq_length of the benchmark: the longest batch it can train on


def _llama32_3b_with(peft_config, seq: int = PEFT_SEQ):
    """Llama-3.2-3B from trainmem's bundled copy of its config.json, wrapped with `peft_config`."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainmem.frontends.hf import bundled

    entry = bundled()["meta-llama/Llama-3.2-3B"]
    config = AutoConfig.for_model(entry["model_type"], **entry["config"])
    model = get_peft_model(AutoModelForCausalLM.from_config(config), peft_config)

    def make_batch(batch_size):
        ids = torch.randint(0, config.vocab_size, (batch_size, seq))
        return {"input_ids": ids, "labels": ids}
    return {"model": model, "make_batch": make_batch, "loss_fn": lambda output, inputs, *target: output["loss"]}


def peft_llama32_3b_dora():
    """lora/llama-3.2-3B-rank32-dora: LoRA r=32, alpha=64 on q_proj, v_proj with DoRA's magnitude vector."""
    from peft import LoraConfig

    return _llama32_3b_with(LoraConfig(r=32, lora_alpha=64, target_modules=["q_proj", "v_proj"], use_dora=True,
                                       task_type="CAUSAL_LM"))


def peft_llama32_3b_ia3():
    """ia3/llama-3.2-3B-default: IA3 on k_proj, v_proj, down_proj (down_proj as the feed-forward module)."""
    from peft import IA3Config

    return _llama32_3b_with(IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                                      feedforward_modules=["down_proj"]))


def peft_llama32_3b_ln_tuning():
    """ln_tuning/llama-3.2-3B-default: the RMSNorm weights (input, post-attention, final) are trained."""
    from peft import LNTuningConfig

    return _llama32_3b_with(LNTuningConfig(target_modules=["input_layernorm", "post_attention_layernorm", "norm"]))


def peft_llama32_3b_loha():
    """loha/llama-3.2-3B-rank32: LoHa r=32, alpha=64 on q_proj, v_proj."""
    from peft import LoHaConfig

    return _llama32_3b_with(LoHaConfig(r=32, alpha=64, target_modules=["q_proj", "v_proj"]))


def peft_llama32_3b_vera():
    """vera/llama-3.2-3B-default: VeRA r=256 on q_proj, v_proj (shared random projections, d_initial 0.1)."""
    from peft import VeraConfig

    return _llama32_3b_with(VeraConfig(r=256, target_modules=["q_proj", "v_proj"], projection_prng_key=0,
                                       save_projection=True, d_initial=0.1))


def peft_llama32_3b_prompt_tuning():
    """prompt_tuning/llama-3.2-3B-default: 200 trained virtual tokens prepended to every sequence."""
    from peft import PromptTuningConfig

    return _llama32_3b_with(PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=200))


def peft_llama32_3b_oft():
    """oft/llama-3.2-3B-rank32: OFT r=32 (block size from r) on q_proj, v_proj, Cayley-Neumann (5 terms)."""
    from peft import OFTConfig

    return _llama32_3b_with(OFTConfig(r=32, oft_block_size=0, target_modules=["q_proj", "v_proj"],
                                      use_cayley_neumann=True, num_cayley_neumann_terms=5))


def peft_llama32_3b_fourierft():
    """fourierft/llama-3.2-3B-default: 1000 trained spectral coefficients per q_proj/v_proj, scaling 300."""
    from peft import FourierFTConfig

    return _llama32_3b_with(FourierFTConfig(n_frequency=1000, scaling=300, random_loc_seed=777,
                                            target_modules=["q_proj", "v_proj"], init_weights=False))


def peft_llama32_3b_miss():
    """miss/llama-3.2-3B-default: MiSS r=64 (mini_r 1) on q_proj, v_proj."""
    from peft import MissConfig

    return _llama32_3b_with(MissConfig(r=64, mini_r=1, target_modules=["q_proj", "v_proj"]))


def peft_llama32_3b_randlora():
    """randlora/llama-3.2-3B-default: RandLoRA r=32, alpha 640 on q_proj, v_proj (shared random bases)."""
    from peft import RandLoraConfig

    return _llama32_3b_with(RandLoraConfig(r=32, randlora_alpha=640, target_modules=["q_proj", "v_proj"],
                                           projection_prng_key=0, save_projection=True))


def peft_llama32_3b_trainable_tokens():
    """trainable_tokens/llama-3.2-3B-sos+eos: only the embeddings of tokens 128000 and 128001 are trained."""
    from peft import TrainableTokensConfig

    return _llama32_3b_with(TrainableTokensConfig(token_indices=[128000, 128001], target_modules=["embed_tokens"]))
