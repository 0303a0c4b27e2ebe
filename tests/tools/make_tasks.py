#!/usr/bin/env python3
"""Builds tests/data/tasks/bible_cloze.jsonl: a small multiple-choice cloze task for the tiny
models (trained on KJV text) from tests/data/tiny-opt/reference/eval.txt (Colossians, KJV).

Each item: {"context": the two preceding verse lines + verse number + the first half of a verse,
"choices": [4 continuations of 3 words], "label": index of the true one}. Choices carry their
leading space (they are appended to the context verbatim). The distractors are the continuations of three other verses, cut at the same
number of words, so length alone does not give the answer. Deterministic (fixed seed); stdlib
only. Usage: python3 tests/tools/make_tasks.py [--items 50] [--out PATH]
"""
import argparse
import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tests/data/tiny-opt/reference/eval.txt"
OUT = ROOT / "tests/data/tasks/bible_cloze.jsonl"
CONT_WORDS = 3  # words per choice
N_CHOICES = 4


def verses(text):
    out = []
    for line in text.splitlines():
        m = re.match(r"^(\d+:\d+) (.+)$", line.strip())
        if m:
            out.append((m.group(1), m.group(2).split()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--prev", type=int, default=2, help="preceding verses included in the context")
    ap.add_argument("--words", type=int, default=CONT_WORDS, help="words per choice")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    all_vs = verses(SRC.read_text(encoding="utf-8"))
    line_of = {num: f"{num} {' '.join(words)}" for num, words in all_vs}
    prev = {}
    for i, (num, _) in enumerate(all_vs):
        prev[num] = "".join(line_of[all_vs[j][0]] + "\n" for j in range(max(0, i - args.prev), i))
    vs = [v for v in all_vs if len(v[1]) >= 4 + args.words + 1]
    # Split each verse: context = the first half of its words (at least 4), continuation = the
    # next CONT_WORDS words.
    cut = {}
    for num, words in vs:
        k = max(4, len(words) // 2 - 1)
        k = min(k, len(words) - args.words)
        cut[num] = (" ".join(words[:k]), " " + " ".join(words[k:k + args.words]))
    picked = rng.sample(vs, min(args.items, len(vs)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for num, _ in picked:
            ctx, right = cut[num]
            others = [cut[n][1] for n, _ in vs if n != num and cut[n][1] != right]
            choices = rng.sample(others, N_CHOICES - 1)
            label = rng.randrange(N_CHOICES)
            choices.insert(label, right)
            f.write(json.dumps({"context": f"{prev[num]}{num} {ctx}", "choices": choices, "label": label},
                               ensure_ascii=False) + "\n")
    print(f"wrote {len(picked)} items to {args.out}")


if __name__ == "__main__":
    main()
