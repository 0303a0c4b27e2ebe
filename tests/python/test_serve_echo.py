"""flexh2o.serve's "echo": the prompt's text and, with logprobs, its tokens and their
log-probabilities come first in each choice, as lm-eval-harness's `local-completions` model reads
them for loglikelihood (echo, logprobs 1, max_tokens 1; the context's length cut off the front):
the sums and is_greedy equal LLM.loglikelihood's, in memory and offloaded."""

import pytest

import flexh2o
from conftest import TINY
from test_serve import Running


@pytest.fixture(scope="module", params=["memory", "offloaded"])
def echo_server(request):
    kw = {"percent": [0, 100, 0, 100, 100, 0], "gpu_batch_size": 2} if request.param == "offloaded" else {}
    llm = flexh2o.LLM(str(TINY["llama"]), device="cpu", **kw)
    srv = Running(llm, max_new_tokens=8)
    yield srv, llm
    srv.stop()


def lm_eval_parse(choice, ctxlen):
    """lm-eval 0.4's LocalCompletionsAPI.parse_logprobs for one choice."""
    lp = choice["logprobs"]
    tokens_logprobs = lp["token_logprobs"][ctxlen:-1]
    top = lp["top_logprobs"][ctxlen:-1]
    greedy = all(tok == max(t.values()) for tok, t in zip(tokens_logprobs, top))
    return sum(tokens_logprobs), greedy


def test_lm_evals_loglikelihood_requests(echo_server):
    srv, llm = echo_server
    text = "In the beginning God created the heaven and the earth. And the earth was without form"
    ids = [llm.bos_id] + llm.encode(text, add_special=False)
    pairs = [(ids[:n], ids[n:n + k]) for n, k in [(5, 3), (9, 1), (2, 7), (12, 4)]]
    # One request, a prompt of token ids per pair (lm-eval batches them so).
    status, body = srv.request("POST", "/v1/completions", {
        "model": "m", "prompt": [c + x for c, x in pairs], "temperature": 0, "max_tokens": 1, "logprobs": 1,
        "seed": 1234, "echo": True})
    assert status == 200, body
    choices = sorted(body["choices"], key=lambda c: c["index"])
    want = llm.loglikelihood(pairs)
    assert len(choices) == len(pairs)
    for (ctx, cont), choice, (ll, greedy) in zip(pairs, choices, want):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ctx) + len(cont) + 1  # the prompt and the one generated token
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
        # The one alternative and, where it is not that, the token itself, as OpenAI answers.
        for tok, top, logprob in zip(lp["tokens"][1:], lp["top_logprobs"][1:], lp["token_logprobs"][1:]):
            assert 1 <= len(top) <= 2 and top[tok] == logprob, (tok, top)
        got, got_greedy = lm_eval_parse(choice, len(ctx))
        assert got == pytest.approx(ll, rel=1e-5, abs=1e-5)
        assert got_greedy == greedy
        assert choice["text"].startswith(llm.decode(ctx + cont))
    assert body["usage"]["prompt_tokens"] == sum(len(c) + len(x) for c, x in pairs)
    assert body["usage"]["completion_tokens"] == len(pairs)


def test_echo_without_logprobs_and_with_no_new_tokens(echo_server):
    srv, llm = echo_server
    base = {"model": "m", "prompt": "And God said", "temperature": 0, "max_tokens": 5}
    _, plain = srv.request("POST", "/v1/completions", base)
    _, echoed = srv.request("POST", "/v1/completions", {**base, "echo": True})
    prompt_text = "And God said"  # as given, as OpenAI echoes it: no BOS text ("<s>" from decode)
    assert llm.decode(llm.encode(prompt_text)) != prompt_text
    assert echoed["choices"][0]["text"] == prompt_text + plain["choices"][0]["text"]
    assert echoed["choices"][0]["logprobs"] is None
    status, only = srv.request("POST", "/v1/completions", {**base, "echo": True, "max_tokens": 0, "logprobs": 0})
    assert status == 200, only
    c = only["choices"][0]
    assert c["text"] == prompt_text and c["finish_reason"] == "length"
    assert len(c["logprobs"]["tokens"]) == len(llm.encode("And God said"))
    assert c["logprobs"]["top_logprobs"][1] == {c["logprobs"]["tokens"][1]: c["logprobs"]["token_logprobs"][1]}
