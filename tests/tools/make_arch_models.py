#!/usr/bin/env python3
"""Writes tiny random Mistral and Qwen2 checkpoints with transformers' own model classes, and
the logits transformers computes for them, under tests/data/arch/<name>/ (developer tool, not CI;
needs torch, transformers, safetensors):

    python3 tests/tools/make_arch_models.py [NAME ...]   (default: all of them)

Each directory holds config.json and model.safetensors as save_pretrained writes them (float16)
and reference/logits.json in the format of the tiny models' references (per-position argmax and
the last position's logits, for id sequences). Every parameter is drawn at random, biases and
norm weights included (transformers initialises biases to zero, which would hide a bias that is
not applied), and wide enough that the top two logits of every position are well apart.
  mistral  MistralForCausalLM, GQA, sliding_window 20 (the 23- and 48-token prompts pass it).
  qwen2    Qwen2ForCausalLM: q/k/v biases without an o_proj bias, rope_theta 1e6, tied embeddings.
  qwen3    Qwen3ForCausalLM: RMSNorm over each head of q and k (q_norm, k_norm) before rotary,
           tied embeddings.
  phi3     Phi3ForCausalLM: q/k/v in one qkv_proj, gate/up in one gate_up_proj; sliding_window 19,
           odd as Phi-3-mini-4k's 2047, below the 23- and 47-token prompts.
  qwen2_window  Qwen2ForCausalLM with use_sliding_window, max_window_layers 1: layer 1 slides
           (window 20), layer 0 is full.
Rope scaling, each type with settings small enough that the prompts reach the scaled region:
  llama_llama3     LlamaForCausalLM, rope_type llama3 over an original length of 32 (kept,
                   smoothed and divided wavelengths all occur).
  qwen2_yarn       YaRN, factor 4 over 16 positions, max_position_embeddings 32: flexh2o allows
                   64 positions (the prompts reach 48); attention factor 1.139.
  mistral_linear   linear, factor 2, max_position_embeddings 32 (flexh2o allows 64).
  llama_longrope   LongRoPE with the pretraining length 24 given at the top level, as Phi-3 does;
                   prompts up to 23 tokens (beyond 24 transformers switches to the long factors).
  phi3_longrope    Phi-3-128k's LongRoPE: pretraining length 24 at the top level only.
  phi3_partial     Phi-4-mini's partial_rotary_factor 0.75 (48 of head_dim 64 turn) with tied embeddings.
  phi3_hd96        Phi-3-mini's head_dim 96 (hidden 96 over 1 head), which CUDA runs too.
Mixtures of experts, 4 experts of which each token takes 2; a seed is kept only when, in every
layer and for every token, the second and third routing probabilities are at least 0.002 apart
(so fp16 rounding on a GPU cannot change which experts a token takes):
  mixtral    MixtralForCausalLM: block_sparse_moe.experts.E.w1/w2/w3, weights renormalized.
  qwen3_moe  Qwen3MoeForCausalLM: q_norm / k_norm, mlp.experts.E.*_proj of moe_intermediate_size 48,
             norm_topk_prob false (the chosen probabilities as they are).
  qwen2_moe  Qwen2MoeForCausalLM: q/k/v biases, experts of 48 and a shared expert of 80 gated by
             sigmoid(shared_expert_gate), norm_topk_prob true.
  olmoe      OlmoeForCausalLM: q_norm / k_norm over the whole q / k projection (hidden 128 over 2
             heads and 2 KV heads of 64, so that a norm per head would differ), experts of
             intermediate_size 32, tied embeddings; prompts up to 32 tokens (fewer routing
             choices to keep apart).
Gemma, GeGLU (tanh GELU), every RMSNorm by 1 + weight, embeddings times sqrt(hidden), tied:
  gemma      GemmaForCausalLM.
  gemma2     Gemma2ForCausalLM: norms after attention and MLP too, query_pre_attn_scalar 48,
             soft caps 5 on the attention scores and 3 on the logits (small enough to bite),
             layer 0 sliding-window (20, below the 23- and 48-token prompts), layer 1 full.
  gemma3_text_linear  Gemma3ForCausalLM: as gemma2 without soft caps, with per-head q/k norms; the
             sliding layer rotates by theta 1e4, the full one by theta 1e6 with linear factor 2.
  gemma3_text_mm  Gemma3ForConditionalGeneration (model_type gemma3: the text model inside, a
             tiny SigLIP vision tower beside it), text-only prompts; its weights are named
             model.language_model.*, as transformers 5 saves them.
"""
import json
import pathlib
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, MixtralConfig,
                          MixtralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, OlmoeConfig, OlmoeForCausalLM, GemmaConfig, GemmaForCausalLM,
                          Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM, Gemma3Config,
                          Gemma3ForConditionalGeneration, SiglipVisionConfig)

OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "arch"
# head_dim 64 (explicit, over hidden 64) so that the CUDA attention kernels run them too (tests/gpu);
# GQA with 2 heads over 1 KV head. Small and stored as float16 (the references are computed from
# the rounded weights): the device tool carries the working tree with the GPU pack, 64 MiB in all.
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1,
              eos_token_id=2, torch_dtype="float16")
# Phi3Config checks rope lists against hidden / heads whatever head_dim says: its models get head_dim
# 64 from hidden 64 over 1 head.
PHI3 = dict(COMMON, num_attention_heads=1)
del PHI3["head_dim"]
LENGTHS = (1, 7, 23, 48)
ROUTING_GAP = 0.002
WANT = set(sys.argv[1:])


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def routers(model):
    """The MoE routers (MixtralTopKRouter, Qwen3MoeTopKRouter): modules named ...mlp.gate."""
    return [m for name, m in model.named_modules() if name.endswith("mlp.gate")]


def reference(model, seed, lengths):
    """The prompts' logits, or None when some position's top two logits are within 3e-4 of the
    spread (an argmax that rounding could flip) or, in a MoE, a token's last chosen expert and
    the first one left out are within ROUTING_GAP in probability."""
    g = torch.Generator().manual_seed(seed + 1)
    prompts = []
    gaps = []

    def gap(module, inputs, output):
        probs = torch.softmax(output[0].float(), dim=-1).sort(dim=-1, descending=True).values
        k = module.top_k
        gaps.append((probs[:, k - 1] - probs[:, k]).min().item())

    hooks = [r.register_forward_hook(gap) for r in routers(model)]
    for n in lengths:
        ids = torch.randint(3, model.config.get_text_config().vocab_size, (1, n), generator=g)
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        if gaps and min(gaps) < ROUTING_GAP:
            break
        top2 = logits.topk(2, dim=-1).values
        if (top2[:, 0] - top2[:, 1]).min().item() < 3e-4 * (logits.max() - logits.min()).item():
            return None
        prompts.append({"prompt": f"random ids, {n} tokens", "ids": ids[0].tolist(),
                        "argmax": logits.argmax(-1).tolist(), "last_logits": logits[-1].tolist()})
    for h in hooks:
        h.remove()
    if gaps and min(gaps) < ROUTING_GAP:
        return None
    return prompts


def write(name, model, note, seed, lengths=LENGTHS):
    if WANT and name not in WANT:
        return
    d = OUT / name
    # fp32 compute: a multimodal model builds its text model in text_config's dtype (float16 here)
    model.float().eval()
    for seed in range(seed, seed + 5000, 100):  # the first seed without near ties
        randomize(model, seed)
        with torch.no_grad():  # the stored float16 weights, computed in float32 (parameters only:
            for p in model.parameters():  # Module.half() would round the rotary buffers too)
                p.copy_(p.half().float())
        prompts = reference(model, seed, lengths)
        if prompts:
            break
    assert prompts, f"{name}: every seed tried has a near tie in some argmax"
    model.half().save_pretrained(d, safe_serialization=True)
    note += f" (seed {seed})"
    (d / "reference").mkdir(exist_ok=True)
    (d / "reference" / "logits.json").write_text(json.dumps(
        {"description": note, "vocab_size": model.config.get_text_config().vocab_size, "prompts": prompts}) + "\n")
    print(f"{d}: {sum(p.numel() for p in model.parameters())} parameters")


def main():
    torch.manual_seed(0)
    write("mistral", MistralForCausalLM(MistralConfig(**COMMON, sliding_window=20, tie_word_embeddings=False)),
          "tiny random MistralForCausalLM (transformers), float16, sliding_window 20", seed=11)
    write("qwen2", Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True,
                                                use_sliding_window=False)),
          "tiny random Qwen2ForCausalLM (transformers), float16, q/k/v biases, tied embeddings", seed=12)
    write("qwen2_window", Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True,
                                                       use_sliding_window=True, sliding_window=20,
                                                       max_window_layers=1)),
          "tiny random Qwen2ForCausalLM (transformers), float16, layer 1 sliding (window 20)", seed=30)
    short = dict((k, v) for k, v in COMMON.items() if k != "max_position_embeddings")
    write("llama_llama3", LlamaForCausalLM(LlamaConfig(**COMMON, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
          "tiny random LlamaForCausalLM (transformers), float16, rope_type llama3 over 32 positions", seed=13)
    write("qwen2_yarn", Qwen2ForCausalLM(Qwen2Config(**short, max_position_embeddings=32, tie_word_embeddings=False,
                                                     use_sliding_window=False, rope_scaling=dict(
        type="yarn", factor=4.0, original_max_position_embeddings=16))),
          "tiny random Qwen2ForCausalLM (transformers), float16, YaRN factor 4 over 16 positions", seed=14)
    write("mistral_linear", MistralForCausalLM(MistralConfig(**short, max_position_embeddings=32, sliding_window=None,
                                                             rope_scaling=dict(type="linear", factor=2.0))),
          "tiny random MistralForCausalLM (transformers), float16, linear rope scaling factor 2", seed=15)
    write("llama_longrope", LlamaForCausalLM(LlamaConfig(**short, max_position_embeddings=96,
                                                         original_max_position_embeddings=24, rope_scaling=dict(
        rope_type="longrope", short_factor=[1.0 + 0.1 * i for i in range(32)],
        long_factor=[2.0 + i for i in range(32)]))),
          "tiny random LlamaForCausalLM (transformers), float16, LongRoPE within its 24 pretraining positions",
          seed=16, lengths=(1, 7, 23, 24))
    write("qwen3", Qwen3ForCausalLM(Qwen3Config(**COMMON, rope_theta=1e6, tie_word_embeddings=True,
                                                use_sliding_window=False)),
          "tiny random Qwen3ForCausalLM (transformers), float16, q_norm / k_norm, tied embeddings",
          seed=20)
    write("phi3", Phi3ForCausalLM(Phi3Config(**PHI3, sliding_window=19, pad_token_id=None)),
          "tiny random Phi3ForCausalLM (transformers), float16, fused qkv_proj / gate_up_proj, sliding_window 19",
          seed=17, lengths=(1, 7, 23, 47))
    write("phi3_longrope", Phi3ForCausalLM(Phi3Config(**dict(PHI3, max_position_embeddings=96), pad_token_id=None,
                                                      original_max_position_embeddings=24, rope_scaling=dict(
        type="longrope", short_factor=[1.0 + 0.08 * i for i in range(32)], long_factor=[3.0 + i for i in range(32)]))),
          "tiny random Phi3ForCausalLM (transformers), float16, LongRoPE within its 24 pretraining positions",
          seed=18, lengths=(1, 7, 23, 24))
    write("phi3_partial", Phi3ForCausalLM(Phi3Config(**PHI3, pad_token_id=None, partial_rotary_factor=0.75,
                                                     tie_word_embeddings=True)),
          "tiny random Phi3ForCausalLM (transformers), float16, partial_rotary_factor 0.75, tied embeddings", seed=19)
    write("phi3_hd96", Phi3ForCausalLM(Phi3Config(**dict(PHI3, hidden_size=96),
                                                  pad_token_id=None, sliding_window=None)),
          "tiny random Phi3ForCausalLM (transformers), float16, head_dim 96 as Phi-3-mini's", seed=24)
    moe = dict(num_experts_per_tok=2, output_router_logits=False)
    write("mixtral", MixtralForCausalLM(MixtralConfig(**COMMON, **moe, num_local_experts=4, sliding_window=None,
                                                      tie_word_embeddings=False)),
          "tiny random MixtralForCausalLM (transformers), float16, 4 experts, 2 a token", seed=21)
    write("qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(**COMMON, **moe, num_experts=4, moe_intermediate_size=48,
                                                          norm_topk_prob=False, tie_word_embeddings=False,
                                                          use_sliding_window=False)),
          "tiny random Qwen3MoeForCausalLM (transformers), float16, 4 experts, 2 a token, norm_topk_prob false",
          seed=22)
    write("qwen2_moe", Qwen2MoeForCausalLM(Qwen2MoeConfig(**COMMON, **moe, num_experts=4, moe_intermediate_size=48,
                                                          shared_expert_intermediate_size=80, norm_topk_prob=True,
                                                          tie_word_embeddings=False, use_sliding_window=False)),
          "tiny random Qwen2MoeForCausalLM (transformers), float16, 4 experts, 2 a token, a gated shared expert",
          seed=23)
    olmoe = dict((k, v) for k, v in COMMON.items() if k != "head_dim")
    write("olmoe", OlmoeForCausalLM(OlmoeConfig(**dict(olmoe, hidden_size=128, num_key_value_heads=2,
                                                     intermediate_size=32), **moe, num_experts=4,
                                                tie_word_embeddings=True, pad_token_id=None)),
          "tiny random OlmoeForCausalLM (transformers), float16, 4 experts, 2 a token, q/k norms over the projection",
          seed=25, lengths=(1, 7, 23, 32))
    gemma = dict(COMMON, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    write("gemma", GemmaForCausalLM(GemmaConfig(**COMMON, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True)),
          "tiny random GemmaForCausalLM (transformers), float16", seed=26)
    write("gemma2", Gemma2ForCausalLM(Gemma2Config(**gemma, query_pre_attn_scalar=48, sliding_window=20,
                                                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                                   attn_implementation="eager")),
          "tiny random Gemma2ForCausalLM (transformers), float16, soft caps 5 and 3, a sliding layer", seed=27)
    write("gemma3_text_linear", Gemma3ForCausalLM(Gemma3TextConfig(
        **gemma, query_pre_attn_scalar=48, sliding_window=20, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
        attn_implementation="eager")),
          "tiny random Gemma3ForCausalLM (transformers), float16, q/k norms, a rope per layer type", seed=28)
    text = Gemma3TextConfig(**gemma, query_pre_attn_scalar=48, sliding_window=20,
                            layer_types=["sliding_attention", "full_attention"])
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    write("gemma3_text_mm", Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision,
                                                                        mm_tokens_per_image=4)),
          "tiny random Gemma3ForConditionalGeneration (transformers), float16, text-only prompts", seed=29)


if __name__ == "__main__":
    main()
