#!/usr/bin/env python3
"""Writes a real model's sentencepiece tokenizer.model from the vocabulary in a GGUF file
(developer tool; needs gguf and sentencepiece/protobuf from PyPI), so that
check_real_tokenizer.py can compare flexh2o with transformers on it offline.

    python3 tests/tools/spm_from_gguf.py GGUF OUTDIR

GGUF: a llama.cpp file whose tokenizer.ggml.model is "llama" (sentencepiece BPE), e.g. the vocab-only
vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf (LLaMA's 32000 pieces) in the llama-cpp-python
sdist (`pip download --no-deps --no-binary :all: llama-cpp-python`). GGUF keeps each piece's
text, score and type (llama.cpp's token types are sentencepiece's), and the special ids; the
trainer and normalizer settings are LLaMA's (BPE, byte fallback, identity). OUTDIR gets
tokenizer.model and a tokenizer_config.json as Vicuna's (LlamaTokenizer, legacy false, BOS added).
"""
import json
import pathlib
import sys

from gguf import GGUFReader
from sentencepiece import sentencepiece_model_pb2 as pb


def field(reader, key):
    f = reader.fields[key]
    if len(f.data) == 1 and f.types[0].name not in ("STRING", "ARRAY"):
        return f.parts[f.data[0]][0].item()
    if f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return [bytes(f.parts[i]).decode("utf-8") if f.types[-1].name == "STRING" else f.parts[i][0].item()
            for i in f.data]


def main():
    gguf_file, out = sys.argv[1], pathlib.Path(sys.argv[2])
    r = GGUFReader(gguf_file)
    if field(r, "tokenizer.ggml.model") != "llama":
        sys.exit(f"{gguf_file}: tokenizer.ggml.model is not 'llama' (sentencepiece)")
    tokens, scores = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.scores")
    types = field(r, "tokenizer.ggml.token_type")
    m = pb.ModelProto()
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = t, s, ty
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.byte_fallback = True
    ts.unk_id = field(r, "tokenizer.ggml.unknown_token_id") if "tokenizer.ggml.unknown_token_id" in r.fields else 0
    ts.bos_id = field(r, "tokenizer.ggml.bos_token_id")
    ts.eos_id = field(r, "tokenizer.ggml.eos_token_id")
    ts.pad_id = -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(m.SerializeToString())
    piece = lambda i: tokens[i]  # noqa: E731
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "legacy": False, "add_bos_token": True, "add_eos_token": False,
        "bos_token": piece(ts.bos_id), "eos_token": piece(ts.eos_id), "unk_token": piece(ts.unk_id),
        "pad_token": None}, indent=1) + "\n")
    print(f"{out}: {len(tokens)} pieces, bos {ts.bos_id}, eos {ts.eos_id}, unk {ts.unk_id}")


if __name__ == "__main__":
    main()
