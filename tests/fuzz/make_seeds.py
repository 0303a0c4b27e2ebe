#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (run from any
directory; python3 standard library only). Seeds are small, valid inputs cut from the test data,
so the fuzzers start past the first checks. The store_header seeds are written by the target
itself (fuzz_store_header -write_seeds=DIR: real DiskStore files); see scripts/fuzz.sh --seeds."""
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
OUT = ROOT / "tests" / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def compact(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def safetensors(tensors, metadata=None, pad=0):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = compact(header).encode()
    text += b" " * ((-(8 + len(text)) % 8) + pad)  # data section 8-aligned, as the library writes it
    return struct.pack("<Q", len(text)) + text + blob


def spm_proto(pieces):
    """A sentencepiece ModelProto: pieces (<unk> unknown, <s> </s> control, others normal) and a
    trainer_spec with model_type BPE and pad_id -1."""
    def varint(v):
        v &= (1 << 64) - 1
        out = b""
        while True:
            out += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
            v >>= 7
            if not v:
                return out

    def field(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    types = {"<unk>": 2, "<s>": 3, "</s>": 3}
    out = b""
    for i, p in enumerate(pieces):
        out += field(1, field(1, p.encode()) + varint(2 << 3 | 5) + struct.pack("<f", -i) +
                     varint(3 << 3) + varint(types.get(p, 1)))
    return out + field(2, varint(3 << 3) + varint(2) + varint(43 << 3) + varint(-1))


def small_tokenizer(name, keep_ids):
    """A tokenizer.json from tests/data/tokenizers/NAME cut to ids < keep_ids."""
    j = json.loads((DATA / "tokenizers" / name / "tokenizer.json").read_text())
    m = j["model"]
    m["vocab"] = {t: i for t, i in m["vocab"].items() if i < keep_ids}
    merges = [p if isinstance(p, list) else p.split(" ") for p in m["merges"]]
    m["merges"] = [p for p in merges if p[0] in m["vocab"] and p[1] in m["vocab"] and p[0] + p[1] in m["vocab"]]
    j["added_tokens"] = [t for t in j["added_tokens"] if t["id"] < keep_ids]
    cfg = (DATA / "tokenizers" / name / "tokenizer_config.json").read_text()
    return compact(j).encode() + b"\0" + compact(json.loads(cfg)).encode()


def main():
    f32 = struct.pack("<6f", 1, -2, 0.5, 3e38, -0.0, 7)
    put("safetensors", "two_tensors", safetensors([("a.weight", "F32", [2, 3], f32),
                                                   ("b", "F16", [4], bytes(8))], {"format": "pt"}))
    put("safetensors", "mixed_dtypes", safetensors([("x", "BF16", [1, 1, 2], bytes(4)), ("y", "I64", [2], bytes(16)),
                                                    ("z", "U8", [3], b"abc"), ("e", "I32", [0], b"")], pad=8))
    put("safetensors", "empty_header", safetensors([]))

    # torch.save checkpoints written by tests/tools/make_torch_checkpoints.py (small ones: the
    # fuzzer reads at most 16 KiB), accepted and refused.
    torch = DATA / "torch"
    put("torch_checkpoint", "misc", (torch / "misc" / "pytorch_model.bin").read_bytes())
    put("torch_checkpoint", "misc_zip64", (torch / "misc" / "zip64.bin").read_bytes())
    for f in sorted((torch / "bad").glob("*.bin")):
        put("torch_checkpoint", "bad_" + f.stem, f.read_bytes())

    for name in ("tiny-opt", "tiny-llama"):
        put("config", name, (DATA / name / "config.json").read_bytes())
    put("config", "minimal_llama", compact({"model_type": "llama", "vocab_size": 8, "hidden_size": 4,
                                            "num_hidden_layers": 1, "num_attention_heads": 2,
                                            "intermediate_size": 8, "max_position_embeddings": 16}))
    # tiny-llama's config with each rope type's optional keys, and the Qwen3 / Phi-3 / MoE model types.
    llama = json.loads((DATA / "tiny-llama" / "config.json").read_text())
    half = llama["hidden_size"] // llama["num_attention_heads"] // 2
    ropes = {
        "rope_llama3": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
        "rope_yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 64, "mscale": 0.7,
                                          "mscale_all_dim": 1.0, "truncate": False}},
        "rope_longrope": {"original_max_position_embeddings": 64,
                          "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(half)],
                                           "long_factor": [2.0] * half}},
        "qwen3": {"model_type": "qwen3", "head_dim": 64},
        "phi3_partial": {"model_type": "phi3", "partial_rotary_factor": 0.75, "sliding_window": 47},
        "mixtral": {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
        "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "head_dim": 64,
                      "moe_intermediate_size": 96, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "mlp_only_layers": []},
        "qwen2_moe": {"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "qkv_bias": True,
                      "moe_intermediate_size": 48, "shared_expert_intermediate_size": 80},
        "olmoe": {"model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2, "clip_qkv": None},
        "gemma": {"model_type": "gemma", "hidden_act": "gelu", "head_dim": 64},
        "gemma2": {"model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 48,
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": None, "sliding_window": 64,
                   "layer_types": ["sliding_attention", "full_attention"] * 2},
        "gemma3_text": {"model_type": "gemma3_text", "head_dim": 64, "sliding_window": 32, "sliding_window_pattern": 2,
                        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
        "gemma3_text_old": {"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                            "rope_local_base_freq": 1e4, "rope_theta": 1e6},
    }
    for name, extra in ropes.items():
        put("config", name, compact({**llama, **extra}))
    # A multimodal Gemma 3: the text model's config inside, partly left to Gemma3TextConfig's defaults.
    put("config", "gemma3_multimodal", compact({"model_type": "gemma3", "torch_dtype": "bfloat16",
                                                "text_config": {"model_type": "gemma3_text", "hidden_size": 64,
                                                                "intermediate_size": 128, "num_hidden_layers": 6,
                                                                "head_dim": 64, "sliding_window": 32}}))

    put("tokenizer_json", "bytelevel", small_tokenizer("bytelevel", 300))
    put("tokenizer_json", "llama2", small_tokenizer("llama2", 420))
    put("tokenizer_json", "llama3", small_tokenizer("llama3", 300))
    put("tokenizer_json", "metaspace", small_tokenizer("metaspace", 420))
    # The other normalizer / pre-tokenizer types (Digits, Split behaviours, NFKC, Bert, ...).
    for name, keep in (("digits-bytelevel", 300), ("split-behaviors", 300), ("split-invert", 300),
                       ("split-empty", 300), ("split-star", 300), ("norm-sequence", 300), ("nfkc-punct", 200),
                       ("whitespace-punct", 200), ("metaspace-nfc", 300), ("metaspace-never", 300), ("bert", 200)):
        put("tokenizer_json", name, small_tokenizer(name, keep))

    vocab = json.loads((DATA / "tiny-opt" / "vocab.json").read_text())
    vocab = {t: i for t, i in vocab.items() if i < 300}
    lines = (DATA / "tiny-opt" / "merges.txt").read_text().split("\n")
    merges = [lines[0]] + [l for l in lines[1:] if l.count(" ") == 1 and all(p in vocab for p in l.split(" "))
                           and l.replace(" ", "") in vocab]
    special = (DATA / "tiny-opt" / "special_tokens_map.json").read_text()
    put("vocab_merges", "tiny_opt", compact(vocab).encode() + b"\0" + "\n".join(merges).encode() + b"\0" +
        special.encode())
    put("vocab_merges", "no_version_line", compact({"a": 0, "b": 1, "ab": 2, "</s>": 3}) + "\0a b\r\n")

    # tokenizer.model: the whole input is the file (protobuf holds NUL bytes); a real trained
    # model and a hand-written one (varint, fixed32 and nested fields, a negative id).
    put("sentencepiece", "spm_llama", (DATA / "tokenizers" / "spm-llama" / "tokenizer.model").read_bytes())
    put("sentencepiece", "hand_written", spm_proto(["<unk>", "<s>", "</s>", "\u2581", "a", "\u2581a", "ab"]))

    put("request_jsonl", "prompts", (ROOT / "configs" / "prompts" / "bible.jsonl").read_text().split("\n", 3)[0] +
        "\n" + compact({"id": 7, "prompt_ids": [2, 100, 5], "max_new_tokens": 4, "temperature": 0.7,
                        "top_k": 40, "top_p": 0.9, "seed": 1}) + "\n")
    put("request_jsonl", "bad_and_blank_lines", '{"prompt": "a"}\r\n\n  \t\n[1, 2]\n{"prompt": \n"x"\n{"id": null}')

    put("policy", "flexgen_30b", compact({"percent": [20, 80, 0, 100, 0, 100], "gpu_batch_size": 48,
                                          "num_gpu_batches": 3, "cpu_cache_compute": True}))
    put("policy", "every_field", compact({"gpu_batch_size": 4, "num_gpu_batches": 2, "w_gpu_percent": 50.5,
                                          "w_cpu_percent": 25, "cache_gpu_percent": 0, "cache_cpu_percent": 100,
                                          "act_gpu_percent": 100, "act_cpu_percent": 0, "overlap": False,
                                          "sep_layer": True, "pin_weight": False, "cpu_cache_compute": False}))
    put("policy", "empty_object", "{}")


if __name__ == "__main__":
    main()
