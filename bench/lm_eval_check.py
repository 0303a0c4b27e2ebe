# Developer check (not CI): lm-evaluation-harness through `--model flexh2o` against flexh2o's own
# CLI on the same items, for each model and KV/offloading configuration: multiple choice
# (lm-eval acc vs `eval-choice` acc; acc_norm explained below), perplexity (each document's
# loglikelihood_rolling vs `eval-ppl --streaming`) and greedy generation (generate_until vs
# `generate --greedy`). Run by bench/lm_eval_check.sh inside the lm-eval venv; prints a table.
"""acc_norm / acc_bytes: both tools divide each choice's log-likelihood by the choice's length in
characters / UTF-8 bytes, so lm-eval's numbers must equal eval-choice's. eval-choice's
acc_norm_token (per token) is recomputed from the per-choice log-likelihoods lm-eval logged
(--log_samples) with the continuation token counts the adapter sent."""
import argparse
import glob
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "data" / "tasks"
CHOICE, PPL, GEN = "flexh2o_bible_cloze", "flexh2o_bible_ppl", "flexh2o_bible_gen"
H2O = {"kv_policy": "h2o", "heavy_ratio": "0.1", "recent_ratio": "0.1"}
CONFIGS = [  # name, --model_args extras, CLI flags
    ("full", {}),
    ("h2o 10%+10%", H2O),
    ("h2o 10%+10%, percent 50 50 0 100 0 100", {**H2O, "percent": "50 50 0 100 0 100"}),
]


def cli_flags(extra):
    out = []
    for k, v in extra.items():
        out += ["--" + k.replace("_", "-"), *str(v).split()]
    return out


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stderr[-4000:]}")
    return r.stdout


def lm_eval(model, extra, out):
    margs = ",".join([f"pretrained={model}", *(f"{k}={v}" for k, v in extra.items())])
    run([sys.executable, "-m", "flexh2o.lm_eval", "--model", "flexh2o", "--model_args", margs,
         "--include_path", TASKS / "lm_eval", "--tasks", f"{CHOICE},{PPL},{GEN}", "--num_fewshot", "0",
         "--device", "cpu", "--log_samples", "--output_path", out], cwd=ROOT)
    results = json.load(open(sorted(glob.glob(f"{out}/**/results_*.json", recursive=True))[-1]))
    samples = {}
    for task in (CHOICE, PPL, GEN):
        path = sorted(glob.glob(f"{out}/**/samples_{task}_*.jsonl", recursive=True))[-1]
        samples[task] = sorted((json.loads(line) for line in open(path)), key=lambda s: s["doc_id"])
    return results, samples


def argmax(xs):
    return max(range(len(xs)), key=lambda i: (xs[i], -i))  # first maximum, as numpy


def check_choice(llm, adapter, binary, model, extra, results, samples, tmp):
    ec = json.loads(run([binary, "eval-choice", "-m", model, "--tasks", TASKS / "bible_cloze.jsonl",
                         "--num-fewshot", "0", "--device", "cpu", "--progress", "never", "--json",
                         *cli_flags(extra)]))
    n = len(samples)
    acc = tok_norm = 0
    split_differs = 0
    for s in samples:
        doc, lls = s["doc"], [float(r[0]) for r in s["filtered_resps"]]
        pairs = [(doc["context"], ch) for ch in doc["choices"]]
        toks = [len(cont) for _, cont in adapter.encode_requests(pairs)]
        acc += argmax(lls) == doc["label"]
        tok_norm += argmax([ll / t for ll, t in zip(lls, toks)]) == doc["label"]
        ctx = llm.encode(doc["context"], add_special=False)  # eval-choice's split differs where
        for ch in doc["choices"]:                            # a merge crosses the boundary
            whole = llm.encode(doc["context"] + ch, add_special=False)
            split_differs += whole[:len(ctx)] != ctx
    r = results["results"][CHOICE]
    row = {"lm-eval acc": r["acc,none"], "eval-choice acc": ec["acc"], "recomputed acc": acc / n,
           "lm-eval acc_norm": r["acc_norm,none"], "eval-choice acc_norm": ec["acc_norm"],
           "lm-eval acc_bytes": r["acc_bytes,none"], "eval-choice acc_bytes": ec["acc_bytes"],
           "acc_norm per token from lm-eval": tok_norm / n, "eval-choice acc_norm_token": ec["acc_norm_token"],
           "split differs": split_differs}
    ok = (r["acc,none"] == ec["acc"] == acc / n and r["acc_norm,none"] == ec["acc_norm"]
          and r["acc_bytes,none"] == ec["acc_bytes"] and tok_norm / n == ec["acc_norm_token"])
    return row, ok


def check_engine(extra, results):
    """What the engine reported it ran (lm-eval's results "config", from FlexH2OLM.get_model_info)."""
    e = results["config"]["flexh2o_engine"]
    moved = sum(e.get("offload_bytes_moved", {}).values())
    ok = ("h2o" in e["kv_policy"]) == ("kv_policy" in extra)
    if "percent" in extra:
        ok &= moved > 0 and e["offload_policy"]["percent"] == [float(x) for x in extra["percent"].split()]
    else:
        ok &= "offload_policy" not in e
    return {"engine kv_policy": e["kv_policy"], "offload bytes moved": moved}, ok


def check_ppl(binary, model, extra, samples, tmp, bos_text):
    """eval-ppl scores BOS + the text; lm-eval's models score the prefix token + tok_encode(text),
    which starts with the BOS the tokenizer adds (bos_text: its text, "" for none): so eval-ppl is
    given that BOS's text in front, which its tokenizer reads as the BOS token."""
    worst = 0.0
    for s in samples:
        f = Path(tmp) / "doc.txt"
        f.write_text(bos_text + s["doc"]["text"])
        p = json.loads(run([binary, "eval-ppl", "-m", model, "--max-tokens", "100000", "--streaming", "--device",
                            "cpu", "--progress", "never", "--json", *cli_flags(extra), f]))
        ours = float(s["filtered_resps"][0] if not isinstance(s["filtered_resps"][0], list)
                     else s["filtered_resps"][0][0])
        cli = -p["mean_nll"] * p["tokens"]
        worst = max(worst, abs(ours - cli) / abs(cli))
    return {"ppl docs": len(samples), "max rel. diff vs eval-ppl": worst}, worst < 1e-9


def slug(name):
    return "".join(c if c.isalnum() else "_" for c in name)


def check_gen(binary, model, extra, samples, tmp):
    inp, out = Path(tmp) / "gen_in.jsonl", Path(tmp) / "gen_out.jsonl"
    inp.write_text("".join(json.dumps({"id": s["doc_id"], "prompt": s["doc"]["context"]}) + "\n" for s in samples))
    if out.exists():
        out.unlink()
    run([binary, "generate", "-m", model, "--input", inp, "--output", out, "--greedy", "-n", "16", "--device", "cpu",
         "--progress", "never", *cli_flags(extra)])
    cli = {j["id"]: j["text"].split("\n")[0] for j in map(json.loads, out.read_text().splitlines())}
    same = sum(s["filtered_resps"][0] == cli[s["doc_id"]] for s in samples)
    return {"generations equal": f"{same}/{len(samples)}"}, same == len(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ROOT / "build" / "flexh2o"))
    ap.add_argument("--out", default=None, help="lm-eval output folder (default: a temporary one)")
    ap.add_argument("models", nargs="*", default=[str(ROOT / "tests/data/tiny-opt"), str(ROOT / "tests/data/tiny-llama")])
    a = ap.parse_args()
    import flexh2o
    from flexh2o.lm_eval_adapter import HarnessAdapter

    out_root = Path(a.out or tempfile.mkdtemp(prefix="lm_eval_check."))
    rows, all_ok = [], True
    for model in a.models:
        llm = flexh2o.LLM(model, device="cpu")
        adapter = HarnessAdapter(llm)
        bos_text = llm.decode([adapter.vocab.bos_id]) if adapter.vocab.bos_id is not None else ""
        for name, extra in CONFIGS:
            with tempfile.TemporaryDirectory() as tmp:
                results, samples = lm_eval(model, extra, out_root / Path(model).name / slug(name))
                row, oks = {"model": Path(model).name, "config": name}, []
                for part, ok in (check_choice(llm, adapter, a.binary, model, extra, results, samples[CHOICE], tmp),
                                 check_ppl(a.binary, model, extra, samples[PPL], tmp, bos_text),
                                 ({"lm-eval word_perplexity": results["results"][PPL]["word_perplexity,none"]}, True),
                                 check_gen(a.binary, model, extra, samples[GEN], tmp),
                                 check_engine(extra, results)):
                    row.update(part)
                    oks.append(ok)
                row["ok"] = all(oks)
                all_ok &= row["ok"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    keys = list(rows[0])
    table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        table.append("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    text = "\n".join(table)
    print(text)
    (out_root / "summary.md").write_text(text + "\n")
    print(f"lm-eval outputs and summary.md in {out_root}", file=sys.stderr)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
