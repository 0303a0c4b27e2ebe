#!/usr/bin/env python3
"""Checks `flexh2o tokenize` / `detokenize` against Hugging Face `tokenizers` on a real model's
tokenizer.json, or against transformers' LlamaTokenizer on a real tokenizer.model (developer
tool; needs `tokenizers`, and for tokenizer.model transformers + sentencepiece + protobuf, in a
venv, not the build).

    python3 tests/tools/check_real_tokenizer.py --flexh2o build/flexh2o --tokenizer DIR [--texts FILE]

DIR holds tokenizer.json (e.g. SmolLM2's, from /work/shared/tools/smollm2_from_gguf.py; or Qwen2's
and LLaMA-3's: AutoTokenizer.from_pretrained(MODELS, gguf_file="ggml-vocab-qwen2.gguf").save_pretrained(DIR),
MODELS being vendor/llama.cpp/models of the llama-cpp-python sdist), or only tokenizer.model and
tokenizer_config.json (e.g. LLaMA's, from tests/tools/spm_from_gguf.py). The texts
are every line of tests/data/tiny-opt/reference/eval.txt, README.md and two source files, the
whole eval text, a chat template, the awkward texts and Unicode fuzz of make_tokenizer_cases.py
(and the lines of --texts). Prints the match counts for ids (no special
tokens added) and for decoding HF's ids; exits 1 on any mismatch, listing the first few.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tokenizer_cases as cases  # noqa: E402  (the shared text lists)


def run_jsonl(flexh2o, sub, tok_dir, rows, extra):
    with tempfile.TemporaryDirectory() as d:
        inp, out = pathlib.Path(d) / "in.jsonl", pathlib.Path(d) / "out.jsonl"
        inp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        subprocess.run([flexh2o, sub, "--tokenizer", str(tok_dir), *extra, "--input", str(inp),
                        "--output", str(out)], check=True)
        return [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]


def oracle(tok_dir):
    """(encode without special tokens, decode keeping them) of the reference implementation."""
    if (tok_dir / "tokenizer.json").exists():
        hf = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        return (lambda t: hf.encode(t, add_special_tokens=False).ids), (lambda ids: hf.decode(ids, skip_special_tokens=False))
    from transformers import LlamaTokenizer
    hf = LlamaTokenizer.from_pretrained(str(tok_dir))
    return (lambda t: hf.encode(t, add_special_tokens=False)), (lambda ids: hf.decode(ids, skip_special_tokens=False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flexh2o", required=True)
    ap.add_argument("--tokenizer", required=True, type=pathlib.Path)
    ap.add_argument("--texts", type=pathlib.Path)
    a = ap.parse_args()
    root = HERE.parents[1]
    texts = [t for t in cases.TRAIN.split("\n") if t.strip()] + cases.TEXTS + cases.UNICODE_TEXTS
    for f in ("README.md", "src/tokenizer/pipeline.cpp", "tests/tools/make_tokenizer_cases.py"):  # prose, code
        texts += [t for t in (root / f).read_text(encoding="utf-8").split("\n") if t.strip()]
    texts += [cases.TRAIN, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>"]
    if a.texts:
        texts += a.texts.read_text(encoding="utf-8").splitlines()
    encode, decode = oracle(a.tokenizer)
    want = [encode(t) for t in texts]
    got = run_jsonl(a.flexh2o, "tokenize", a.tokenizer, [{"text": t} for t in texts], ["--no-special"])
    dec = run_jsonl(a.flexh2o, "detokenize", a.tokenizer, [{"ids": w} for w in want], [])
    bad_ids = [i for i, (w, g) in enumerate(zip(want, got)) if g.get("ids") != w]
    bad_dec = [i for i, (w, g) in enumerate(zip(want, dec)) if g.get("text") != decode(w)]
    print(f"{a.tokenizer}: ids match {len(texts) - len(bad_ids)}/{len(texts)}, "
          f"decode matches {len(texts) - len(bad_dec)}/{len(texts)}")
    for i in (bad_ids + bad_dec)[:5]:
        print(f"  mismatch: {texts[i]!r}\n    hf {want[i]}\n    flexh2o {got[i].get('ids')} {dec[i].get('text')!r}")
    return 1 if bad_ids or bad_dec else 0


if __name__ == "__main__":
    sys.exit(main())
