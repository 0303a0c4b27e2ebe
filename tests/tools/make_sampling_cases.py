#!/usr/bin/env python3
"""Writes tests/data/sampling/cases.json: random logits and token histories, and the distribution
transformers samples from after its logits processors, in the order `generate` applies them
(RepetitionPenaltyLogitsProcessor, then TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper), so the C++ Sampler is checked against the library users
compare with. Developer tool, not CI; needs torch and transformers:

    python3 tests/tools/make_sampling_cases.py

A case whose top-p or min-p cut lies within 1e-4 of its threshold is drawn again: float32 (here)
and double (the Sampler) may round such a case to different sides.
"""
import json
import pathlib
import random

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "sampling" / "cases.json"
VOCAB = 40


def processors(p):
    procs = LogitsProcessorList()
    if p["repetition_penalty"] != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p["repetition_penalty"]))
    procs.append(TemperatureLogitsWarper(p["temperature"]))
    if p["top_k"] > 0:
        procs.append(TopKLogitsWarper(p["top_k"]))
    if p["top_p"] < 1.0:
        procs.append(TopPLogitsWarper(p["top_p"]))
    if p["min_p"] > 0.0:
        procs.append(MinPLogitsWarper(p["min_p"]))
    return procs


def near_a_cut(logits, history, p):
    """Whether a top-p or min-p decision is within 1e-4 of its threshold (in float64)."""
    x = logits.astype(np.float64)
    r = p["repetition_penalty"]
    for i in set(history):
        x[i] = x[i] * r if x[i] < 0 else x[i] / r
    x = np.sort(x / p["temperature"])[::-1]
    if p["top_k"] > 0:
        x = x[: p["top_k"]]
    prob = np.exp(x - x[0])
    prob /= prob.sum()
    if p["top_p"] < 1.0 and np.min(np.abs(np.cumsum(prob) - p["top_p"])) < 1e-4:
        return True
    return p["min_p"] > 0.0 and np.min(np.abs(prob / prob[0] - p["min_p"])) < 1e-4


def main():
    rng = random.Random(20261204)
    cases = []
    while len(cases) < 60:
        p = dict(temperature=rng.choice([0.5, 0.8, 1.0, 1.7]), top_k=rng.choice([0, 0, 5, 12]),
                 top_p=rng.choice([1.0, 1.0, 0.9, 0.6]), min_p=rng.choice([0.0, 0.0, 0.05, 0.2]),
                 repetition_penalty=rng.choice([1.0, 1.3, 0.8, 2.0]))
        logits = np.array([rng.gauss(0.0, 2.0) for _ in range(VOCAB)], dtype=np.float32)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
        generated = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 8))]
        if near_a_cut(logits, prompt + generated, p):
            continue
        ids = torch.tensor([prompt + generated])
        scores = processors(p)(ids, torch.tensor(logits)[None, :].clone())
        probs = torch.softmax(scores.double(), dim=-1)[0].tolist()
        # float32 logits in their shortest round-trip form; probabilities to 9 digits (checked to 1e-6).
        cases.append(dict(params=p, logits=[float(str(v)) for v in logits], prompt=prompt, generated=generated,
                          probs=[float(f"{v:.9g}") for v in probs]))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                               "cases": cases}, indent=None) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
