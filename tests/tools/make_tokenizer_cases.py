#!/usr/bin/env python3
"""Builds small tokenizer.json files for the tokenizer.json variants flexh2o supports and records
the ids / decoded text that Hugging Face `tokenizers` produces for a list of awkward texts.

Output: tests/data/tokenizers/<variant>/{tokenizer.json, tokenizer_config.json, cases.json}.
The files are committed, so the C++ tests need no Python. Re-run after changing the variants:
    python3 tests/tools/make_tokenizer_cases.py [VARIANT...]   (default: all)
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
  digits-bytelevel  SmolLM2/StarCoder: Sequence[Digits(individual_digits), ByteLevel(use_regex)].
  nfkc-punct NFKC normalizer; Sequence[Whitespace, Punctuation, Digits(contiguous)]; no decoder
             (tokens joined with spaces), unk for unseen characters.
  whitespace-punct  no normalizer; Sequence[Punctuation(merged_with_next), Whitespace] (\\w as
             Oniguruma defines it, on raw superscripts, Roman numerals, marks).
  metaspace-nfc  NFC normalizer; Metaspace(always, split) pre-tokenizer and decoder; byte_fallback.
  metaspace-never  NFKD normalizer; Metaspace(never, no split); byte_fallback.
  split-behaviors / split-invert  a Sequence of Split (String and Regex patterns) with every
             behaviour, without and with invert, plus CharDelimiterSplit; ByteLevel(use_regex=false).
  split-empty / split-star  Split and Replace with regexes that match the empty string.
  norm-sequence  Sequence[Strip, Lowercase, NFD, StripAccents, Replace (Regex and String),
             Prepend] before ByteLevel(add_prefix_space).
  bert       BertNormalizer + BertPreTokenizer on a BPE model; no decoder.
The texts include Unicode that normalization changes: composed/decomposed accents, ligatures,
full-width digits, superscripts, Hangul, combining marks, Σ/İ casing, controls.
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
    # Unicode that normalizers change, and splitting corner cases.
    "caf\u00e9 vs cafe\u0301", "\u00c5ngstr\u00f6m A\u030angstro\u0308m \u212b", "\ufb01ne \ufb02ow \ufb03x",
    "\uff11\uff12\uff13 full-width \uff21\uff22\uff23", "x\u00b2 + y\u00b3 = H\u2082O \u00bd \u2460\u2461 \u216b \u2177",
    "\ud55c\uad6d\uc5b4 \u1112\u1161\u11ab\u1100\u116e\u11a8", "a\u0300\u0301\u0302 \u0301leading mark",
    "\u0130stanbul \u03a3\u0391\u03a3 stra\u00dfe \u01c5 \u01c4", "\u0939\u093f\u0928\u094d\u0926\u0940 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\u4e2d\u6587\u5b57\u7b26 and \u3042\u3044", "nul\u0000mid \u200bzw\u200d \ufeffbom soft\u00adhyphen \u0007bell",
    "\ufdfa \u2126 \u00b5 \u017f", "a|b||c|", "snake_case under__score", "well-known re-entry -x- --",
    "1,234.56 3-4 x:y 2024-12-01", "no,space.after!this?ok", "  \u00a0 mixed \u2003 spaces \u3000 ",
    "\u2028line\u2029para\u0085nel", "(((nested))) [a] {b} <c>", "tab\tthen 99 bottles",
    "'quoted' \"double\" \u00abguillemets\u00bb \u201csmart\u201d", "\u2581already metaspace\u2581",
]


def fuzz_texts(n=60, seed=1234, unicode=False):
    """Random mixes of the awkward pieces above (fixed seed: the output is committed)."""
    parts = [" ", "  ", "\n", "\t", "\r", "a", "Z", "e", "th", "the", "'", "'s", "'S", "'ll", "1",
             "23", "4567", ".", ",", "!", "...", "é", "ß", "Ω", "日", "😀", "\u00a0", "<s>", "</s>",
             "<mask>", "<|eot_id|>", "<|endoftext|>", "God", "LORD", "x", "q"]
    if unicode:
        parts += ["e\u0301", "\ufb01", "\uff17", "\u00b2", "\u1100\u1161", "\u0130", "-", "|", "_",
                  "\u0301", "\u3000", "\u2581", "\u00c5", "A\u030a"]
    rng = random.Random(seed)
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 25))) for _ in range(n)]


TEXTS += fuzz_texts()
# Only the new variants get these (the older variants' committed cases stay as they are).
UNICODE_TEXTS = fuzz_texts(40, seed=99, unicode=True)


def train_bpe(model, normalizer, pre_tok, specials, vocab_size, alphabet=()):
    tok = Tokenizer(model)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tok
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=list(alphabet), show_progress=False)
    tok.train_from_iterator([TRAIN], trainer)
    return tok


def record(name, tok, config, note, raw_json=None, extra_texts=()):
    """raw_json: the exact file to write (to keep forms that to_str() would rewrite)."""
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(raw_json or tok.to_str(pretty=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
    cases = []
    for text in TEXTS + list(extra_texts):
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
    if not out["eval_text_decoded_matches"]:  # lossy normalizers / pre-tokenizers
        out["eval_text_decoded"] = tok.decode(full)
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


BYTELEVEL_ALPHABET = pre_tokenizers.ByteLevel.alphabet()


def digits_bytelevel():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok = train_bpe(models.BPE(), None, pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 600,
                    BYTELEVEL_ALPHABET)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    record("digits-bytelevel", tok, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
           "SmolLM2/StarCoder style: Sequence[Digits(individual), ByteLevel(use_regex)]",
           extra_texts=UNICODE_TEXTS)


def normalized_alphabet(norm):
    """Every character the normalizer leaves in the texts, so that tokens (not <unk>) show what
    the normalization produced."""
    return sorted({c for t in TEXTS + UNICODE_TEXTS for c in norm.normalize_str(t) if not c.isspace()})


def nfkc_punct():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
                                   pre_tokenizers.Digits(individual_digits=False)])
    tok = train_bpe(models.BPE(unk_token="<unk>"), normalizers.NFKC(), pre, ["<unk>", "<s>", "</s>"], 700,
                    normalized_alphabet(normalizers.NFKC()))
    record("nfkc-punct", tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
           "NFKC; Sequence[Whitespace, Punctuation, Digits(contiguous)]; no decoder; unk",
           extra_texts=UNICODE_TEXTS)


def whitespace_punct():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Punctuation(behavior="merged_with_next"),
                                   pre_tokenizers.Whitespace()])
    tok = train_bpe(models.BPE(unk_token="<unk>"), None, pre, ["<unk>", "<s>", "</s>"], 700,
                    normalized_alphabet(normalizers.Sequence([])))
    record("whitespace-punct", tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
           "no normalizer; Sequence[Punctuation(merged_with_next), Whitespace] on raw Unicode; no decoder",
           extra_texts=UNICODE_TEXTS)


def metaspace_variant(name, norm, scheme, split):
    tok = train_bpe(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True), norm,
                    pre_tokenizers.Metaspace(replacement=SPM, prepend_scheme=scheme, split=split),
                    ["<unk>", "<s>", "</s>"], 500)

    def edit(j):  # the 256 <0xNN> byte tokens, as byte_fallback vocabularies have them
        v = j["model"]["vocab"]
        for b in range(256):
            v.setdefault(f"<0x{b:02X}>", len(v))
    tok = rebuild(tok, edit)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement=SPM, prepend_scheme=scheme, split=split),
                                     decoders.ByteFallback(), decoders.Fuse()])
    record(name, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
           f"{type(norm).__name__}; Metaspace({scheme}, split={split}) pre-tokenizer and decoder; byte_fallback",
           extra_texts=UNICODE_TEXTS)


def split_variant(name, invert):
    b = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.CharDelimiterSplit("|"),
        pre_tokenizers.Split(Regex(r"\p{N}+"), behavior=b[1], invert=invert),
        pre_tokenizers.Split("-", behavior=b[2], invert=invert),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior=b[3], invert=invert),
        pre_tokenizers.Split(Regex(r"\s"), behavior=b[4], invert=invert),
        pre_tokenizers.Split("'" if not invert else Regex(r"[^_]+"), behavior=b[0], invert=invert),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(models.BPE(), None, pre, ["<|endoftext|>"], 500, BYTELEVEL_ALPHABET)
    tok.decoder = decoders.ByteLevel()
    record(name, tok, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
           f"Sequence of Split with every behaviour (invert={invert}) + CharDelimiterSplit",
           extra_texts=UNICODE_TEXTS)


def split_empty():
    """Patterns that match the empty string: lookarounds, \\b, and e* (Oniguruma keeps an empty
    match unless it follows the previous match directly)."""
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"(?=\p{Lu})"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"(?<=[.,])"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"(?=-)"), behavior="merged_with_next", invert=True),
        pre_tokenizers.Split(Regex(r"(?=')"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"\b"), behavior="removed"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    # Not at the start of a text: tokenizers duplicates text inserted there once pre-tokenizers slice it.
    norm = normalizers.Replace(Regex(r"(?<=\d)(?=\d)"), "#")
    tok = train_bpe(models.BPE(), norm, pre, ["<|endoftext|>"], 400, BYTELEVEL_ALPHABET)
    tok.decoder = decoders.ByteLevel()
    record("split-empty", tok, {"eos_token": "<|endoftext|>"},
           "Split/Replace with empty-matching regexes (lookarounds, \\b)", extra_texts=UNICODE_TEXTS)
    star = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"e*"), behavior="merged_with_previous"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = train_bpe(models.BPE(), None, star, ["<|endoftext|>"], 300,
                    BYTELEVEL_ALPHABET)
    tok.decoder = decoders.ByteLevel()
    record("split-star", tok, {"eos_token": "<|endoftext|>"},
           "Split(e*, merged_with_previous): an empty match right after a match is skipped",
           extra_texts=UNICODE_TEXTS)


def norm_sequence():
    norm = normalizers.Sequence([
        normalizers.Strip(left=True, right=True), normalizers.Lowercase(), normalizers.NFD(),
        normalizers.StripAccents(), normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Replace("ss", "\u00df"), normalizers.Prepend(">")])
    tok = train_bpe(models.BPE(), norm, pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"],
                    500, BYTELEVEL_ALPHABET)
    tok.decoder = decoders.ByteLevel()
    record("norm-sequence", tok, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
           "Sequence[Strip, Lowercase, NFD, StripAccents, Replace x2, Prepend] + ByteLevel(add_prefix_space)",
           extra_texts=UNICODE_TEXTS)


def bert():
    tok = train_bpe(models.BPE(unk_token="[UNK]"), normalizers.BertNormalizer(),
                    pre_tokenizers.BertPreTokenizer(), ["[UNK]", "[CLS]", "[SEP]"], 700,
                    normalized_alphabet(normalizers.BertNormalizer()))
    record("bert", tok, {"unk_token": "[UNK]"}, "BertNormalizer + BertPreTokenizer, BPE model, no decoder",
           extra_texts=UNICODE_TEXTS)


VARIANTS = {"tiny-opt-files": tiny_opt_files, "bytelevel": bytelevel, "llama2": llama2,
            "metaspace": metaspace, "llama3": llama3, "digits-bytelevel": digits_bytelevel,
            "nfkc-punct": nfkc_punct, "whitespace-punct": whitespace_punct, "metaspace-nfc": lambda: metaspace_variant("metaspace-nfc", normalizers.NFC(), "always", True),
            "metaspace-never": lambda: metaspace_variant("metaspace-never", normalizers.NFKD(), "never", False),
            "split-behaviors": lambda: split_variant("split-behaviors", False),
            "split-invert": lambda: split_variant("split-invert", True),
            "split-empty": split_empty, "norm-sequence": norm_sequence, "bert": bert}

if __name__ == "__main__":
    import sys
    for v in sys.argv[1:] or VARIANTS:  # default: all
        VARIANTS[v]()
