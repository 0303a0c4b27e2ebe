#!/usr/bin/env python3
"""Trains a small sentencepiece BPE model the way LLaMA's was trained (byte fallback, split
digits, identity normalization, no whitespace collapsing) and records what transformers'
LlamaTokenizer does with it when a checkpoint ships only tokenizer.model (Vicuna, OpenLLaMA):
ids, tokens and decoded text for the awkward texts of make_tokenizer_cases.py.

Output: tests/data/tokenizers/<variant>/{tokenizer.model, tokenizer_config.json (not spm-bare),
cases.json}, committed, so the C++ tests need no Python. Developer tool (not CI); needs
sentencepiece, protobuf, transformers and tokenizers:
    pip install sentencepiece protobuf transformers tokenizers
    python3 tests/tools/make_spm_cases.py
Variants (one model, different tokenizer_config.json):
  spm-llama     LlamaTokenizer, legacy false (Vicuna's config): U+2581 only at the start.
  spm-legacy    legacy true: U+2581 before every run of text between special tokens.
  spm-noprefix  add_prefix_space false, add_eos_token true.
  spm-bare      no tokenizer_config.json at all (transformers 5 defaults: nothing added, legacy false).
The model has a user-defined symbol (<|user|>: matched in text, not special) and a control
symbol (<ctrl>: special). It also prints where the sentencepiece library itself disagrees with
transformers, for information (transformers is the reference these tests follow).
"""
import json
import pathlib
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_tokenizer_cases import OUT, TEXTS, TRAIN, UNICODE_TEXTS  # noqa: E402

import sentencepiece as spm  # noqa: E402
from transformers import LlamaTokenizer  # noqa: E402

EXTRA = ["<|user|>hi<ctrl>there", "a <|user|> b <ctrl> c", "<s> <|user|></s>", "  <ctrl>  ",
         "x" * 3000, " ".join(["LORD"] * 400), "1234567890" * 50]


def train(model_prefix):
    lines = [line for line in TRAIN.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=model_prefix, model_type="bpe", vocab_size=900,
        character_coverage=0.9995, byte_fallback=True, split_digits=True, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", allow_whitespace_only_pieces=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, user_defined_symbols=["<|user|>"], control_symbols=["<ctrl>"],
        hard_vocab_limit=False, num_threads=1, minloglevel=2)


def record(name, model_file, config, note):
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    shutil.copy(model_file, d / "tokenizer.model")
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    tok = LlamaTokenizer.from_pretrained(str(d))
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    cases, differ = [], 0
    for text in TEXTS + UNICODE_TEXTS + EXTRA:
        plain = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True)
        cases.append({
            "text": text,
            "ids": plain,
            "tokens": tok.convert_ids_to_tokens(plain),
            "ids_with_special": with_special,
            "decoded": tok.decode(plain, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(plain, skip_special_tokens=True),
            "decoded_with_special": tok.decode(with_special, skip_special_tokens=False),
        })
        differ += sp.encode(text) != plain
    full = tok.encode(TRAIN, add_special_tokens=False)
    out = {"description": note, "vocab_size": len(tok), "cases": cases, "eval_text_ids": full,
           "eval_text_decoded_matches": tok.decode(full) == TRAIN}
    if not out["eval_text_decoded_matches"]:
        out["eval_text_decoded"] = tok.decode(full)
    (d / "cases.json").write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{name}: vocab {out['vocab_size']}, {len(cases)} cases, eval ids {len(full)}; "
          f"the sentencepiece library differs on {differ} texts")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        prefix = str(pathlib.Path(tmp) / "spm")
        train(prefix)
        model = prefix + ".model"
        base = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}
        record("spm-llama", model, dict(base, legacy=False),
               "sentencepiece BPE tokenizer.model, LlamaTokenizer legacy false (Vicuna's tokenizer_config)")
        record("spm-legacy", model, dict(base, legacy=True),
               "sentencepiece BPE tokenizer.model, LlamaTokenizer legacy true")
        record("spm-noprefix", model, dict(base, legacy=False, add_prefix_space=False, add_eos_token=True),
               "sentencepiece BPE tokenizer.model, add_prefix_space false, add_eos_token true")
        record("spm-bare", model, None, "sentencepiece BPE tokenizer.model alone (LlamaTokenizer's defaults)")


if __name__ == "__main__":
    main()
