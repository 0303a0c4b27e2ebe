"""flexh2o.LLM.loglikelihood / loglikelihood_rolling against the binary's eval-ppl and
eval-choice, and against each other."""

import json
import math

import pytest

import flexh2o
from conftest import DATA, TINY, run_binary

TEXT = (DATA / "tiny-llama" / "reference" / "eval.txt").read_text()


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_rolling_equals_eval_ppl(llms, tmp_path, model):
    # eval-ppl --streaming scores BOS + the first N tokens one token per step: the same sum.
    llm = llms[model]
    n = 48
    ids = [llm.bos_id] + llm.encode(TEXT, add_special=False)[:n]
    (got,) = llm.loglikelihood_rolling([ids])
    r = run_binary(["eval-ppl", "-m", TINY[model], "--max-tokens", n, "--json", "--streaming", "--device", "cpu",
                    "--progress", "never", DATA / "tiny-llama" / "reference" / "eval.txt"])
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert want["tokens"] == n
    assert got == pytest.approx(-want["mean_nll"] * n, rel=1e-9)
    assert llm.last_report["scored_tokens"] == n


def test_loglikelihood_is_rolling_difference(llms):
    llm = llms["llama"]
    ids = [llm.bos_id] + llm.encode(TEXT, add_special=False)[:40]
    ctx, cont = ids[:25], ids[25:]
    ((ll, _),) = llm.loglikelihood([(ctx, cont)])
    whole, head = llm.loglikelihood_rolling([ids, ctx])
    # A batched prefill of the context vs one token a step: the same model, other rounding.
    assert ll == pytest.approx(whole - head, abs=1e-3)
    assert ll < 0


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_score_gives_each_tokens_logprob_and_alternatives(llms, model):
    llm = llms[model]
    ids = [llm.bos_id] + llm.encode(TEXT, add_special=False)[:30]
    short = ids[:9]
    got = llm.score([ids, [ids[0]], short], top=3)
    assert llm.last_report["scored_tokens"] == 30 + 8
    assert [len(s) for s in got] == [30, 0, 8]
    # The sums are loglikelihood_rolling's; a prefix scores as the start of the longer sequence.
    whole, head = llm.loglikelihood_rolling([ids, short])
    assert sum(lp for lp, _ in got[0]) == pytest.approx(whole, rel=1e-6)
    assert sum(lp for lp, _ in got[2]) == pytest.approx(head, rel=1e-6)
    assert [lp for lp, _ in got[2]] == pytest.approx([lp for lp, _ in got[0][:8]], rel=1e-6)
    for t, (lp, alts) in enumerate(got[0]):
        assert len(alts) == 3 and alts[0][1] >= alts[1][1] >= alts[2][1]
        assert lp <= alts[0][1] + 1e-6
        if ids[t + 1] == alts[0][0]:
            assert lp == pytest.approx(alts[0][1])
    # is_greedy of loglikelihood is "every token was the first alternative".
    ((_, greedy),) = llm.loglikelihood([(ids[:20], ids[20:24])])
    assert greedy == all(ids[t + 1] == got[0][t][1][0][0] for t in range(19, 23))
    assert all(alts == [] for _, alts in llm.score([ids])[0])
    with pytest.raises(flexh2o.Error, match="top must be in"):
        llm.score([ids], top=21)


def test_is_greedy(llms):
    llm = llms["opt"]
    ctx = llm.encode("In the beginning God created")
    (c,) = llm.generate([ctx], max_new_tokens=5, ignore_eos=True)
    greedy = c.token_ids
    other = [greedy[0] + 1 if greedy[0] + 1 < llm.vocab_size else greedy[0] - 1] + greedy[1:]
    (g_ll, g_is), (o_ll, o_is), (p_ll, p_is) = llm.loglikelihood([(ctx, greedy), (ctx, other), (ctx, greedy[:2])])
    assert g_is is True and p_is is True and o_is is False
    assert o_ll < g_ll and p_ll > g_ll


def encode_pair(llm, context, choice):
    # What eval-choice does (lm-eval's _encode_pair): trailing spaces of the context move to the
    # continuation, whose tokens are those of encode(context + choice) after encode(context).
    ctx = context.rstrip(" ")
    moved = context[len(ctx):]
    ctx_enc = llm.encode(ctx, add_special=False)
    whole = llm.encode(ctx + moved + choice, add_special=False)
    if len(whole) > len(ctx_enc) and whole[:len(ctx_enc)] == ctx_enc:
        cont = whole[len(ctx_enc):]
    else:
        cont = llm.encode(moved + choice, add_special=False)
    return [llm.bos_id] + ctx_enc, cont


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_choices_match_eval_choice(llms, model):
    llm = llms[model]
    tasks = DATA / "tasks" / "bible_cloze.jsonl"
    items = [json.loads(l) for l in tasks.read_text().splitlines()][:20]
    correct = correct_norm = 0
    for it in items:
        reqs = [encode_pair(llm, it["context"], ch) for ch in it["choices"]]
        res = llm.loglikelihood(reqs)
        ll = [r[0] for r in res]
        norm = [r[0] / len(c) for r, (_, c) in zip(res, reqs)]
        correct += ll.index(max(ll)) == it["label"]
        correct_norm += norm.index(max(norm)) == it["label"]
    r = run_binary(["eval-choice", "-m", TINY[model], "--tasks", tasks, "--limit", 20, "--json", "--device", "cpu",
                    "--progress", "never"])
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert (correct, correct_norm) == (want["correct"], want["correct_norm_token"])


def test_streamed_loglikelihood_matches_eval_choice_streaming(tmp_path):
    # streaming=True: each request a token a step, the H2O ratios shares of all its tokens, as
    # `eval-choice --streaming` scores a choice; prefilled contexts give other numbers.
    flags = {"kv_policy": "h2o", "heavy_ratio": 0.1, "recent_ratio": 0.1, "kv_dtype": "f32"}
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", **flags)
    tasks = DATA / "tasks" / "bible_cloze.jsonl"
    items = [json.loads(l) for l in tasks.read_text().splitlines()][:5]
    samples = tmp_path / "samples.jsonl"
    r = run_binary(["eval-choice", "-m", TINY["opt"], "--tasks", tasks, "--limit", 5, "--json", "--device", "cpu",
                    "--progress", "never", "--streaming", "--log-samples", samples,
                    *[x for k, v in flags.items() for x in ("--" + k.replace("_", "-"), v)]])
    assert r.returncode == 0, r.stderr
    logged = [json.loads(l) for l in samples.read_text().splitlines()]
    differs = False
    for it, s in zip(items, logged):
        reqs = [encode_pair(llm, it["context"], ch) for ch in it["choices"]]
        streamed = llm.loglikelihood(reqs, streaming=True)
        prefilled = llm.loglikelihood(reqs)
        for (ll, _), (pre, _), want in zip(streamed, prefilled, s["choices"]):
            assert ll == pytest.approx(want["loglik"], rel=1e-9)
            differs = differs or abs(ll - pre) > 1e-3
    assert differs
    with pytest.raises(TypeError, match="streaming must be a bool"):
        llm.loglikelihood(reqs, streaming="yes")


def test_rolling_of_one_token_is_zero(llms):
    llm = llms["opt"]
    llm.generate([[2, 5]], max_new_tokens=2)
    assert llm.loglikelihood_rolling([[2]]) == [0.0]
    assert llm.last_report is None  # nothing ran: not the generate call's report
    assert llm.loglikelihood([]) == [] and llm.last_report is None


def test_rolling_with_h2o_ratios_matches_eval_ppl(tmp_path):
    # Ratio budgets are fractions of the tokens scored, per sequence, as in eval-ppl.
    llm = flexh2o.LLM(str(TINY["llama"]), device="cpu", kv_policy="h2o", heavy_ratio=0.25, recent_ratio=0.25)
    n = 40
    ids = [llm.bos_id] + llm.encode(TEXT, add_special=False)[:n]
    (got,) = llm.loglikelihood_rolling([ids])
    r = run_binary(["eval-ppl", "-m", TINY["llama"], "--max-tokens", n, "--json", "--device", "cpu",
                    "--progress", "never", "--kv-policy", "h2o", "--heavy-ratio", "0.25", "--recent-ratio", "0.25",
                    DATA / "tiny-llama" / "reference" / "eval.txt"])
    assert r.returncode == 0, r.stderr
    assert got == pytest.approx(-json.loads(r.stdout)["mean_nll"] * n, rel=1e-9)
    (full,) = flexh2o.LLM(str(TINY["llama"]), device="cpu").loglikelihood_rolling([ids])
    assert not math.isclose(got, full, rel_tol=1e-6)  # the policy changed the numbers


def test_rolling_with_ratios_batches_sequences_of_any_length():
    # One runner scores sequences of different lengths together, each under its own ratio
    # budget (a share of its own tokens): the numbers of each alone, and one report for the call.
    llm = flexh2o.LLM(str(TINY["llama"]), device="cpu", kv_policy="h2o", heavy_ratio=0.25, recent_ratio=0.25,
                      percent=[0, 100, 100, 0, 100, 0])
    ids = [llm.bos_id] + llm.encode(TEXT, add_special=False)[:60]
    seqs = [ids[:61], ids[:26], ids[:11], ids[:1]]
    alone = [llm.loglikelihood_rolling([s])[0] for s in seqs]
    together = llm.loglikelihood_rolling(seqs)
    assert together == pytest.approx(alone, rel=1e-6)
    assert together[3] == 0.0
    assert llm.last_report["scored_tokens"] == 60 + 25 + 10
    assert llm.last_report["offload"]["token_steps"] >= 60
