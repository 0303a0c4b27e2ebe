#!/usr/bin/env python3
"""h2o_reference.py — flexh2o's H2O against H2O's own eviction rule, on a real checkpoint.

A developer tool (needs torch + transformers; not CI). The reference is H2O's "real drop" rule
(FMInference/H2O, h2o_hf/utils_real_drop, H2OKVCache_LayerWise), written here again as a
transformers attention function: after every step each layer keeps, per KV head, the `heavy`
cached tokens of highest accumulated attention among all but the last `recent`, and the last
`recent`. Its scores are those of the query heads that share a KV head, summed (the original
indexes K per query head and fails on GQA models). flexh2o's budget counts the new token, so
flexh2o heavy h + recent r is the reference's heavy h + recent r - 1. K and V are rounded to f16
as flexh2o's default cache stores them; the model computes in fp32.

Both feed the first N tokens of a text (BOS first) one per step and report perplexity:
flexh2o through `eval-ppl --streaming`, the reference through the hook. Usage:
  bench/h2o_reference.py --model DIR --text FILE [--tokens 1024] [--budgets 0.1,0.2,0.5]
                         [--flexh2o build/flexh2o]
"""
import argparse
import json
import math
import subprocess

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer


class Cache:
    """Per layer: kept K, V [kv_heads, n, d] and accumulated scores [kv_heads, n]."""

    def __init__(self, heavy=None, recent=None):
        self.heavy, self.recent, self.layers = heavy, recent, {}


CACHE = Cache()


def h2o_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    scaling = module.scaling if scaling is None else scaling
    _, n_heads, q, d = query.shape
    kv_heads = key.shape[1]
    group = n_heads // kv_heads
    k_new = key[0].float().half().float()  # the f16 cache
    v_new = value[0].float().half().float()
    state = CACHE.layers.get(module.layer_idx)
    old = 0 if state is None else state["k"].shape[1]
    k = k_new if state is None else torch.cat([state["k"], k_new], 1)
    v = v_new if state is None else torch.cat([state["v"], v_new], 1)
    n = k.shape[1]
    logits = torch.matmul(query[0].float(), k.repeat_interleave(group, 0).transpose(1, 2)) * scaling
    causal = torch.ones(q, n, dtype=torch.bool).tril(diagonal=old)
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1)
    out = torch.matmul(probs, v.repeat_interleave(group, 0))
    scores = probs.sum(1).view(kv_heads, group, n).sum(1)
    if state is not None:
        scores[:, :old] += state["s"]
    if CACHE.heavy is not None and n > CACHE.heavy + CACHE.recent:
        heavy = torch.topk(scores[:, : n - CACHE.recent], CACHE.heavy, dim=-1).indices.sort(-1).values
        keep = torch.cat([heavy, torch.arange(n - CACHE.recent, n).repeat(kv_heads, 1)], -1)
        k = torch.gather(k, 1, keep[..., None].expand(-1, -1, k.shape[-1]))
        v = torch.gather(v, 1, keep[..., None].expand(-1, -1, v.shape[-1]))
        scores = torch.gather(scores, 1, keep)
    CACHE.layers[module.layer_idx] = {"k": k, "v": v, "s": scores}
    return out.to(query.dtype).transpose(0, 1).unsqueeze(0), None


def reference_ppl(model, ids, heavy=None, recent=None):
    CACHE.__init__(heavy, recent)
    nll = 0.0
    with torch.no_grad():
        for i in range(len(ids) - 1):
            kw = {"input_ids": torch.tensor([[ids[i]]]), "position_ids": torch.tensor([[i]]), "use_cache": False}
            if model.config.model_type == "opt":  # OPT derives positions from the mask
                kw["attention_mask"] = torch.ones(1, i + 1, dtype=torch.long)
            logits = model(**kw).logits[0, -1].float()
            nll -= torch.log_softmax(logits, -1)[ids[i + 1]].item()
    return math.exp(nll / (len(ids) - 1))


def flexh2o_ppl(binary, model_dir, text, tokens, heavy=None, recent=None):
    cmd = [binary, "eval-ppl", "--model", model_dir, "--max-tokens", str(tokens), "--device", "cpu", "--json",
           "--streaming", text]
    if heavy is not None:
        cmd += ["--kv-policy", "h2o", "--heavy-budget", str(heavy), "--recent-budget", str(recent)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["perplexity"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens scored (N)")
    ap.add_argument("--budgets", default="0.1,0.2,0.5", help="fractions of N, split half heavy, half recent")
    ap.add_argument("--flexh2o", default="build/flexh2o")
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    AttentionInterface.register("h2o_reference", h2o_attention)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="h2o_reference")
    tok = AutoTokenizer.from_pretrained(a.model)
    text_ids = tok(open(a.text, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
    ids = [model.config.bos_token_id] + text_ids[: a.tokens]  # eval-ppl scores N tokens after BOS
    print(f"{a.model}: perplexity of {len(ids) - 1} tokens fed one a step; H2O budget b = heavy b/2 + recent b - b/2")
    print("| budget | flexh2o | reference | relative difference |\n|---|---:|---:|---:|")
    rows = [("full", None, None)]
    for f in (float(x) for x in a.budgets.split(",")):
        b = int(f * a.tokens)
        rows.append((f"{f:g} ({b // 2} + {b - b // 2})", b // 2, b - b // 2))
    for label, h, r in rows:
        ours = flexh2o_ppl(a.flexh2o, a.model, a.text, a.tokens, h, r)
        ref = reference_ppl(model, ids, h, None if r is None else r - 1)
        print(f"| {label} | {ours:.5f} | {ref:.5f} | {abs(ours - ref) / ref:.1e} |", flush=True)


if __name__ == "__main__":
    main()
