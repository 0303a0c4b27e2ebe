#!/usr/bin/env python3
"""Writes tests/data/rope/cases.json: config.json files with each rope type transformers knows
for the LLaMA family, and the inverse frequencies and attention factor transformers computes
for them (ROPE_INIT_FUNCTIONS, at load time: no sequence length). Developer tool, not CI; needs
torch and transformers:

    python3 tests/tools/make_rope_cases.py

The settings are those of published checkpoints (Llama 3.1 / 3.2, Qwen2.5's YaRN, Vicuna-16k's
linear scaling, Phi-3's LongRoPE) plus variants for every optional key: old `rope_scaling` with
"type", transformers 5's `rope_parameters`, YaRN's mscale / truncate / attention_factor / a null
factor, and a top-level original_max_position_embeddings.
"""
import json
import pathlib

import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "rope" / "cases.json"


def config(hidden, heads, max_pos, **extra):
    return dict(model_type="llama", vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=heads,
                max_position_embeddings=max_pos, **extra)


def longrope_lists(n):
    return ([1.0 + 0.03 * i for i in range(n)], [1.0 + 0.5 * i for i in range(n)])


short96, long96 = longrope_lists(48)
CASES = {
    "llama-3.1": config(4096, 32, 131072, rope_theta=500000.0, rope_scaling=dict(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192,
        rope_type="llama3")),
    "llama-3.2-1b": config(2048, 32, 131072, rope_theta=500000.0, rope_scaling=dict(
        factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192,
        rope_type="llama3")),
    "llama3-rope-parameters": config(2048, 16, 131072, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=2.0, high_freq_factor=3.0,
        original_max_position_embeddings=4096)),
    "linear-vicuna-16k": config(4096, 32, 4096, rope_scaling=dict(type="linear", factor=4.0)),
    "dynamic": config(2048, 16, 4096, rope_theta=20000.0, rope_scaling=dict(type="dynamic", factor=2.0)),
    "yarn-qwen2.5": config(3584, 28, 32768, rope_theta=1000000.0, rope_scaling=dict(
        factor=4.0, original_max_position_embeddings=32768, type="yarn")),
    "yarn-mscale": config(2048, 16, 163840, rope_theta=10000.0, rope_scaling=dict(
        type="yarn", factor=40.0, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
        mscale=0.707, mscale_all_dim=1.0)),
    "yarn-untruncated": config(1024, 16, 8192, rope_theta=10000.0, rope_scaling=dict(
        rope_type="yarn", factor=None, original_max_position_embeddings=2048, truncate=False,
        attention_factor=0.85, beta_fast=16, beta_slow=2)),
    "longrope-phi3": config(3072, 32, 131072, original_max_position_embeddings=4096, rope_theta=10000.0,
                            rope_scaling=dict(type="longrope", short_factor=short96, long_factor=long96)),
    "longrope-factor": config(3072, 32, 16384, rope_theta=10000.0, rope_scaling=dict(
        rope_type="longrope", factor=2.0, original_max_position_embeddings=8192,
        short_factor=short96, long_factor=long96)),
    "default": config(1024, 8, 2048, rope_theta=123456.0),
}


def main():
    out = {"transformers": transformers.__version__, "cases": []}
    for name, cfg in CASES.items():
        c = LlamaConfig(**cfg)
        rope_type = c.rope_parameters.get("rope_type", "default")
        if rope_type == "default":
            head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
            theta = c.rope_parameters["rope_theta"]
            inv = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
            factor = 1.0
        else:
            inv, factor = ROPE_INIT_FUNCTIONS[rope_type](c, "cpu")
            inv = inv.tolist()
        out["cases"].append({"name": name, "config": cfg, "rope_type": rope_type,
                             "inv_freq": inv, "attention_factor": float(factor)})
        print(f"{name}: {rope_type}, attention factor {float(factor):.6f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
