# The lm-eval adapter on the real engine (no lm_eval needed): multiple-choice accuracy through
# HarnessAdapter equals the binary's eval-choice on the same items, full cache and H2O; every KV
# policy, KV dtype, compression and offloading flag given as --model_args reaches flexh2o.LLM
# (read back from the engine's run report); bad ones fail with LLM's own errors.
import json

import pytest

import flexh2o
from conftest import DATA, TINY, run_binary
from flexh2o import harness as h
from flexh2o.lm_eval_adapter import HarnessAdapter

TASKS = DATA / "tasks" / "bible_cloze.jsonl"
ITEMS = [json.loads(line) for line in TASKS.read_text().splitlines()][:20]
H2O = {"kv_policy": "h2o", "heavy_ratio": 0.1, "recent_ratio": 0.1}


def llm_from_model_args(margs):
    a = h.parse_model_args(margs)
    return flexh2o.LLM(a.model, **a.llm_kwargs)


def argmax(xs):
    return max(range(len(xs)), key=lambda i: (xs[i], -i))


@pytest.mark.parametrize("policy", ["full", "h2o"])
@pytest.mark.parametrize("model", ["opt", "llama", "llama-no-bos"])
def test_adapter_accuracy_equals_eval_choice(model, policy, request):
    # llama-no-bos: a tokenizer with a BOS token it does not add to text (SmolLM2's): no context
    # starts with it, in the adapter (HFLM's default) and in eval-choice.
    extra = H2O if policy == "h2o" else {}
    tok = ["--tokenizer", request.getfixturevalue("no_bos_tokenizer")] if model == "llama-no-bos" else []
    path = TINY[model.removesuffix("-no-bos")]
    llm = llm_from_model_args({"pretrained": str(path), "device": "cpu", **extra,
                               **({"tokenizer": str(tok[1])} if tok else {})})
    ad = HarnessAdapter(llm)
    pairs = [(it["context"], ch) for it in ITEMS for ch in it["choices"]]
    starts = {ctx[0] == llm.bos_id for ctx, _ in ad.encode_requests(pairs)}
    assert starts == {not tok}
    lls = [ll for ll, _ in ad.loglikelihood(pairs)]
    toks = [len(cont) for _, cont in ad.encode_requests(pairs)]
    acc = norm = 0
    k = 0
    for it in ITEMS:
        n = len(it["choices"])
        acc += argmax(lls[k:k + n]) == it["label"]
        norm += argmax([ll / t for ll, t in zip(lls[k:k + n], toks[k:k + n])]) == it["label"]
        k += n
    flags = [f for key, v in extra.items() for f in ("--" + key.replace("_", "-"), str(v))]
    r = run_binary(["eval-choice", "-m", path, "--tasks", TASKS, "--limit", len(ITEMS), "--json",
                    "--device", "cpu", "--progress", "never", *tok, *flags])
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert (acc, norm) == (want["correct"], want["correct_norm_token"])
    if tok:  # eval-choice's contexts: one token (the BOS) fewer than with the tokenizer that adds it
        base = run_binary(["eval-choice", "-m", path, "--tasks", TASKS, "--limit", len(ITEMS), "--json",
                           "--device", "cpu", "--progress", "never", *flags])
        assert json.loads(base.stdout)["mean_context_tokens"] == want["mean_context_tokens"] + 1
    assert ad.engine["kv_policy"] == ("h2o heavy=0.1*prompt recent=0.1*prompt" if extra else "full")


CASES = [  # --model_args as lm-eval passes them (strings where lm-eval leaves strings) -> the report
    ({"kv_policy": "sinks", "sink_tokens": 4, "recent_budget": 8}, {"kv_policy": "sinks sinks=4 recent=8"}),
    ({"kv_policy": "local", "recent_ratio": 0.5}, {"kv_policy": "local recent=0.5*prompt"}),
    ({"kv_policy": "h2o", "heavy_budget": 3, "recent_budget": 5}, {"kv_policy": "h2o heavy=3 recent=5"}),
    ({"kv_policy": "random", "heavy_ratio": 0.2, "recent_ratio": 0.2, "kv_seed": 3},
     {"kv_policy": "random heavy=0.2*prompt recent=0.2*prompt seed=3"}),
    ({"kv_dtype": "bf16"}, {"kv_dtype": "BF16"}),
    ({"compress_weight": True}, {"compress_weight": True}),
    ({"compress_cache": "1"}, {"kv_dtype": "Q4"}),
]


@pytest.mark.parametrize("extra,want", CASES)
def test_kv_and_compression_model_args_reach_the_engine(extra, want):
    llm = llm_from_model_args({"pretrained": str(TINY["opt"]), "device": "cpu", "batch_size": "4", **extra})
    ad = HarnessAdapter(llm)
    ad.loglikelihood([("In the beginning", " God created")])
    assert {k: ad.engine[k] for k in want} == want


def test_offloading_model_args_reach_the_engine(tmp_path):
    llm = llm_from_model_args({"pretrained": str(TINY["opt"]), "device": "cpu", "percent": "0 50 0 100 0 100",
                               "gpu_batch_size": 2, "num_gpu_batches": "2", "cpu_cache_compute": True,
                               "offload_dir": str(tmp_path), "gpu_mem": "64MiB", **H2O})
    ad = HarnessAdapter(llm)
    ad.loglikelihood([("In the beginning", " God created"), ("And the earth", " was without form")])
    pol = ad.engine["offload_policy"]
    assert (pol["percent"], pol["gpu_batch_size"], pol["num_gpu_batches"], pol["cpu_cache_compute"]) == \
        ([0.0, 50.0, 0.0, 100.0, 0.0, 100.0], 2, 2, True)
    assert ad.engine["offload_bytes_moved"]["disk_to_host"] > 0  # half the weights live in offload_dir


def test_bad_model_args_fail_with_the_llms_errors():
    with pytest.raises(TypeError, match="kv_polcy"):
        llm_from_model_args({"pretrained": str(TINY["opt"]), "device": "cpu", "kv_polcy": "h2o"})
    with pytest.raises(flexh2o.Error, match=r"unknown --kv-policy 'h3o' \(valid: full, local, sinks, h2o, random\)"):
        llm_from_model_args({"pretrained": str(TINY["opt"]), "device": "cpu", "kv_policy": "h3o"})
    with pytest.raises(flexh2o.Error, match="--percent"):
        llm_from_model_args({"pretrained": str(TINY["opt"]), "device": "cpu", "percent": "1 2 3"})
