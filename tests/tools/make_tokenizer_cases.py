#!/usr/bin/env python3
"""Builds small tokenizer.json files for the tokenizer.json variants flexh2o supports and records
the ids / decoded text that Hugging Face `tokenizers` produces for a list of awkward texts.

Output: tests/data/tokenizers/<variant>/{tokenizer.json, tokenizer_config.json, cases.json}.
The files are committed, so the C++ tests need no Python. Re-run after changing the variants:
    python3 tests/tools/make_tokenizer_cases.py
Variants:
  bytelevel  GPT-NeoX/OPT style: ByteLevel pre-tokenizer + decoder, merges as "a b" strings,
             an lstrip special token (<mask>).
  llama2     sentencepiece-style BPE: Prepend/Replace U+2581 normalizer, byte_fallback with
             <0xNN> tokens, Replace/ByteFallback/Fuse/Strip decoder, TemplateProcessing "<s> $A".
  llama3     Split (LLaMA-3 regex) + ByteLevel(use_regex=false), ignore_merges,
             Sequence[ByteLevel, TemplateProcessing] post-processor.
  tiny-opt-files  cases only: HF's BPE built from tests/data/tiny-opt/vocab.json + merges.txt,
             to check the vocab.json+merges.txt path on the same texts (no files duplicated).
  metaspace  Mistral-style: Metaspace pre-tokenizer (prepend_scheme first, no split) and a
             Metaspace/ByteFallback/Fuse decoder.
"""
import json
import pathlib
import random

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = (ROOT / "tests/data/tiny-opt/reference/eval.txt").read_text(encoding="utf-8")
OUT = ROOT / "tests/data/tokenizers"
SPM = "\u2581"

TEXTS = [
    "", " ", "  ", "a", "Hello, world!", "  leading spaces", "trailing spaces   ",
    "multiple   spaces\tand\ttabs", "line one\nline two\n\nline four", "\n\n\n", "\r\n", "\t",
    "12345", "numbers 0 7 42 1234567890 3.14159", "Punctuation!?;:--...()[]{}\"'",
    "café naïve résumé", "日本語のテキスト", "emoji 😀 ok 👍🏽", "Ελληνικά and Русский",
    "zqxj QQQ ~~~ `^`", "\u00a0non-breaking\u3000ideographic",
    "It's THEY'RE we've I'M you'll HE'D o'clock 'S",
    "<s>Hello</s>", "a <s> b", "x</s>", "<s><s>", "<unk>", "special <|endoftext|> mid",
    "<|begin_of_text|>Hi<|eot_id|>", "mask: a <mask> b", "a zebraquux b",
    "<0x41> literal byte token text",
    "In the beginning God created the heaven and the earth.",
]


def fuzz_texts(n=60, seed=1234):
    """Random mixes of the awkward pieces above (fixed seed: the output is committed)."""
    parts = [" ", "  ", "\n", "\t", "\r", "a", "Z", "e", "th", "the", "'", "'s", "'S", "'ll", "1",
             "23", "4567", ".", ",", "!", "...", "é", "ß", "Ω", "日", "😀", "\u00a0", "<s>", "</s>",
             "<mask>", "<|eot_id|>", "<|endoftext|>", "God", "LORD", "x", "q"]
    rng = random.Random(seed)
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 25))) for _ in range(n)]


TEXTS += fuzz_texts()


def train_bpe(model, normalizer, pre_tok, specials, vocab_size, alphabet=()):
    tok = Tokenizer(model)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tok
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=list(alphabet), show_progress=False)
    tok.train_from_iterator([TRAIN], trainer)
    return tok


def record(name, tok, config, note, raw_json=None):
    """raw_json: the exact file to write (to keep forms that to_str() would rewrite)."""
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(raw_json or tok.to_str(pretty=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
    cases = []
    for text in TEXTS:
        plain = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": plain.ids,
            "tokens": [tok.id_to_token(i) for i in plain.ids],
            "ids_with_special": with_special,
            "decoded": tok.decode(plain.ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(plain.ids, skip_special_tokens=True),
            "decoded_with_special": tok.decode(with_special, skip_special_tokens=False),
        })
    full = tok.encode(TRAIN, add_special_tokens=False).ids
    out = {"description": note, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
           "cases": cases, "eval_text_ids": full,
           "eval_text_decoded_matches": tok.decode(full) == TRAIN}
    (d / "cases.json").write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{name}: vocab {out['vocab_size']}, eval ids {len(full)}")


def rebuild(tok, edit, want_text=False):
    """Round-trips through JSON so the file can be edited the way real checkpoints look."""
    j = json.loads(tok.to_str())
    edit(j)
    text = json.dumps(j, ensure_ascii=False)
    return (Tokenizer.from_str(text), text) if want_text else Tokenizer.from_str(text)


def bytelevel():
    tok = train_bpe(models.BPE(), None, pre_tokenizers.ByteLevel(add_prefix_space=False),
                    ["<|endoftext|>", "<|padding|>"], 700, pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    def edit(j):  # older files store merges as "a b" strings
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    tok, text = rebuild(tok, edit, want_text=True)
    record("bytelevel", tok, {"tokenizer_class": "GPTNeoXTokenizer", "bos_token": "<|endoftext|>",
                              "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
           "GPT-NeoX style ByteLevel BPE, merges as strings, <mask> with lstrip", raw_json=text)


def spm_base(byte_fallback=True):
    tok = train_bpe(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True),
                    normalizers.Sequence([normalizers.Prepend(SPM), normalizers.Replace(" ", SPM)]),
                    pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="never", split=True),
                    ["<unk>", "<s>", "</s>"], 900)

    def edit(j):  # LLaMA layout: specials, then the 256 <0xNN> byte tokens, then the rest
        old = j["model"]["vocab"]
        new = {"<unk>": 0, "<s>": 1, "</s>": 2}
        for b in range(256):
            new[f"<0x{b:02X}>"] = len(new)
        for t in sorted(old, key=old.get):
            if t not in new:
                new[t] = len(new)
        j["model"]["vocab"] = new
        for a in j["added_tokens"]:
            a["id"] = new[a["content"]]
        j["pre_tokenizer"] = None
    return rebuild(tok, edit)


def llama2():
    tok = spm_base()
    tok.decoder = decoders.Sequence([decoders.Replace(SPM, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    record("llama2", tok, {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                           "add_eos_token": False, "bos_token": {"content": "<s>", "lstrip": False},
                           "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None},
           "LLaMA-2 style: U+2581 normalizer, byte_fallback, Replace/ByteFallback/Fuse/Strip decoder")


def metaspace():
    tok = spm_base()
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement=SPM, prepend_scheme="first"),
                                     decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    record("metaspace", tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
           "Mistral style: Metaspace pre-tokenizer (first, no split), Metaspace decoder, byte_fallback")


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_bpe(models.BPE(ignore_merges=True), None, pre,
                    ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], 800,
                    pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bot)])])

    def edit(j):  # a whole word in the vocab but unreachable by merges: ignore_merges takes it
        j["model"]["vocab"]["\u0120zebraquux"] = len(j["model"]["vocab"])
        j["model"]["ignore_merges"] = True
    tok = rebuild(tok, edit)
    record("llama3", tok, {"tokenizer_class": "PreTrainedTokenizerFast",
                           "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
           "LLaMA-3 style: Split regex + ByteLevel(use_regex=false), ignore_merges")


def tiny_opt_files():
    src = ROOT / "tests/data/tiny-opt"
    tok = Tokenizer(models.BPE.from_file(str(src / "vocab.json"), str(src / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]
    d = OUT / "tiny-opt-files"
    d.mkdir(parents=True, exist_ok=True)
    out = {"description": "HF tokenizers on tiny-opt vocab.json+merges.txt (ids exclude BOS)",
           "cases": cases}
    (d / "cases.json").write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"tiny-opt-files: {len(cases)} cases")


if __name__ == "__main__":
    tiny_opt_files()
    bytelevel()
    llama2()
    metaspace()
    llama3()
