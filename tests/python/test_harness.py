# The lm-evaluation-harness adapter: harness.py's pure functions against values worked out by
# hand, HarnessAdapter's request plumbing against tests/python/fake_llm.py, and (when lm_eval is
# importable) the registered LM class. Needs neither lm_eval, torch nor the _flexh2o extension:
# the two modules are loaded from src/python/flexh2o under a private package name.
import importlib
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_llm import FakeLLM  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src" / "python" / "flexh2o"
_PKG = "_flexh2o_src"
if _PKG not in sys.modules:
    _pkg = types.ModuleType(_PKG)
    _pkg.__path__ = [str(SRC)]
    sys.modules[_PKG] = _pkg
h = importlib.import_module(_PKG + ".harness")
HarnessAdapter = importlib.import_module(_PKG + ".lm_eval_adapter").HarnessAdapter
RequestError = h.RequestError


def vocab_of(llm, bos=True):
    return h.Vocab(encode=lambda t: llm.encode(t, add_special=False), bos_id=llm.bos_id if bos else None,
                   prefix_id=llm.bos_id if llm.bos_id is not None else llm.eos_id)


def pair(llm, context, continuation, bos=True):
    c, x = h.encode_pair(context, continuation, vocab_of(llm, bos))
    return llm.show(c), llm.show(x)


# ---------------------------------------------------------------------------------------------
# encoding


def test_trailing_whitespace_moves_to_the_continuation():
    assert h.move_trailing_whitespace("Q: ", "A") == ("Q:", " A")
    assert h.move_trailing_whitespace("Q:\n\n", "A") == ("Q:", "\n\nA")
    assert h.move_trailing_whitespace("Q:\t \u3000", "x") == ("Q:", "\t \u3000x")  # Unicode space too
    assert h.move_trailing_whitespace("abc", "d") == ("abc", "d")
    assert h.move_trailing_whitespace("   ", "d") == ("", "   d")


def test_encode_pair_plain_and_moved_space():
    llm = FakeLLM()
    assert pair(llm, "The cat", " sat") == (["<s>", "The", " cat"], [" sat"])
    assert pair(llm, "The cat ", "sat") == (["<s>", "The", " cat"], [" sat"])
    assert pair(llm, "Q:\n", "A") == (["<s>", "Q", ":"], ["\n", "A"])
    assert pair(llm, "The cat", " sat", bos=False) == (["The", " cat"], [" sat"])


def test_encode_pair_empty_context_uses_the_prefix_token():
    assert pair(FakeLLM(), "", " sat") == (["<s>"], [" sat"])
    assert pair(FakeLLM(bos=False), "", " sat") == (["</s>"], [" sat"])
    # a continuation that starts with the prefix token: that token is the context
    assert pair(FakeLLM(), "", "<s>Hi there") == (["<s>"], ["Hi", " there"])
    with pytest.raises(RequestError, match="neither a BOS nor an EOS"):
        pair(FakeLLM(bos=False, eos=False), "", " sat")


def test_encode_pair_literal_bos_and_whitespace_only_contexts():
    llm = FakeLLM()
    assert pair(llm, "<s>Hi", " there") == (["<s>", "Hi"], [" there"])  # not a second BOS
    assert pair(llm, "  ", "x") == (["<s>"], [" ", " x"])
    no_bos = FakeLLM(bos=False)
    assert pair(no_bos, " ", "x") == (["</s>"], [" x"])


def test_encode_pair_unicode():
    llm = FakeLLM()
    assert pair(llm, "Größe:", " 10 €") == (["<s>", "Größe", ":"], [" 10", " €"])
    assert pair(llm, "日本 ", "語") == (["<s>", "日本"], [" 語"])


def test_encode_pair_follows_hflm_when_a_merge_crosses_the_boundary():
    llm = FakeLLM()
    # "ab" + "cd e" encodes as ["abcd", " e"]: HFLM's split drops the merged piece's first id
    assert pair(llm, "ab", "cd e") == (["<s>", "ab"], [" e"])
    with pytest.raises(RequestError, match="encodes to no tokens"):
        pair(llm, "ab", "cd")


def test_truncate_left():
    ctx, cont = list(range(1, 11)), [11, 12]
    assert h.truncate_left(ctx, cont, 5) == ([7, 8, 9, 10], [11, 12])  # 6 ids kept, the last not fed
    assert h.truncate_left(ctx, [11, 12, 13, 14, 15], 5) == ([10], [11, 12, 13, 14, 15])
    assert h.truncate_left([1, 2], [3], 5) == ([1, 2], [3])
    with pytest.raises(RequestError, match="continuation is 6 tokens, more than max_length 5"):
        h.truncate_left(ctx, [1, 2, 3, 4, 5, 6], 5)


def test_generation_prompt():
    llm = FakeLLM()
    v = vocab_of(llm)
    ids = h.generation_prompt("a b c d e", v, max_length=8, max_gen_toks=5)
    assert llm.show(ids) == [" c", " d", " e"]  # BOS + 5 pieces, cut to 8 - 5 from the left
    assert llm.show(h.generation_prompt("a", v, 8, 5)) == ["<s>", "a"]
    assert llm.show(h.generation_prompt("", v, 8, 5)) == ["<s>"]
    with pytest.raises(RequestError, match="leaves no room"):
        h.generation_prompt("a", v, 8, 8)


# ---------------------------------------------------------------------------------------------
# rolling windows


def test_rolling_windows_the_documented_example():
    toks = list(range(10, 20))  # lm-eval's docstring example with tokens 0..9 renamed 10..19
    assert h.rolling_windows(toks, 0, 4) == [
        ([0, 10, 11, 12], [10, 11, 12, 13]),
        ([13, 14, 15, 16], [14, 15, 16, 17]),
        ([15, 16, 17, 18], [18, 19]),
    ]
    assert h.rolling_requests(toks, 0, 4) == [([0], [10, 11, 12, 13]), ([13], [14, 15, 16, 17]),
                                               ([15, 16, 17], [18, 19])]


def test_rolling_windows_short_exact_and_with_context():
    assert h.rolling_windows([5, 6], 0, 4) == [([0, 5], [5, 6])]
    assert h.rolling_windows([], 0, 4) == []
    assert h.rolling_windows(list(range(10, 18)), 0, 4) == [([0, 10, 11, 12], [10, 11, 12, 13]),
                                                            ([13, 14, 15, 16], [14, 15, 16, 17])]
    assert h.rolling_windows(list(range(10, 20)), 0, 4, context_len=2) == [
        ([0, 10, 11, 12], [10, 11, 12, 13]),
        ([12, 13, 14, 15], [14, 15, 16]),
        ([15, 16, 17, 18], [17, 18, 19]),
    ]
    assert h.disjoint(([12, 13, 14, 15], [14, 15, 16])) == ([12, 13], [14, 15, 16])
    with pytest.raises(RequestError, match="context_len"):
        h.rolling_windows([1], 0, 4, context_len=5)


@pytest.mark.parametrize("max_length", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 16, 17, 23])
def test_rolling_requests_cover_every_token_once(n, max_length):
    toks = list(range(100, 100 + n))
    seq = [0] + toks
    reqs = h.rolling_requests(toks, 0, max_length)
    assert [t for _, cont in reqs for t in cont] == toks
    for ctx, cont in reqs:
        assert ctx and len(ctx) + len(cont) <= max_length + 1
        end = seq.index(cont[-1]) + 1  # ctx + cont is the slice of BOS + text that ends at cont
        assert seq[end - len(ctx) - len(cont):end] == ctx + cont
    assert all(len(ctx) == 1 for ctx, _ in reqs[:-1])


# ---------------------------------------------------------------------------------------------
# generation kwargs and stops


def test_gen_kwargs_defaults_and_aliases():
    assert h.parse_gen_kwargs({}, 256) == h.GenSpec((), 256, 0.0, 0, 1.0, 0)
    assert h.parse_gen_kwargs(None, 9, default_seed=4) == h.GenSpec((), 9, 0.0, 0, 1.0, 4)
    g = h.parse_gen_kwargs({"until": "\n", "max_gen_toks": 5}, 256)
    assert (g.until, g.max_gen_toks) == (("\n",), 5)
    g = h.parse_gen_kwargs({"until": ["\n\n", "Q:"], "max_tokens": 9, "max_new_tokens": 7}, 256)
    assert (g.until, g.max_gen_toks) == (("\n\n", "Q:"), 7)  # max_new_tokens outranks max_tokens
    g = h.parse_gen_kwargs({"max_completion_tokens": 3, "max_gen_toks": 2}, 256)
    assert g.max_gen_toks == 2
    g = h.parse_gen_kwargs({"top_k": 40, "top_p": 0.9, "seed": 7, "temperature": None}, 256)
    assert (g.top_k, g.top_p, g.seed, g.temperature) == (40, 0.9, 7, 0.0)


def test_gen_kwargs_do_sample_and_temperature():
    t = lambda kw: h.parse_gen_kwargs(kw, 8).temperature  # noqa: E731
    assert t({"temperature": 0.7}) == 0.7                        # do_sample unset: samples
    assert t({"do_sample": False, "temperature": 0.7}) == 0.0    # greedy wins
    assert t({"do_sample": True}) == 1.0                         # Hugging Face's default
    assert t({"do_sample": True, "temperature": 0.5}) == 0.5
    assert t({"do_sample": True, "temperature": 0.0}) == 0.0
    assert t({"do_sample": "false", "temperature": 0.7}) == 0.0


def test_gen_kwargs_errors():
    with pytest.raises(RequestError, match=r"\['num_beams'\] are not supported"):
        h.parse_gen_kwargs({"num_beams": 4, "until": []}, 8)
    with pytest.raises(RequestError, match="temperature must be >= 0"):
        h.parse_gen_kwargs({"temperature": -1}, 8)
    with pytest.raises(RequestError, match="'until' must be"):
        h.parse_gen_kwargs({"until": ["a", 1]}, 8)
    with pytest.raises(RequestError, match="max_gen_toks must be >= 1"):
        h.parse_gen_kwargs({"max_gen_toks": 0}, 8)
    with pytest.raises(RequestError, match="max_gen_toks must be an integer"):
        h.parse_gen_kwargs({"max_gen_toks": "many"}, 8)


def test_cut_at_stops():
    assert h.cut_at_stops("a\n\nb Q: c", ["Q:", "\n\n"]) == "a"  # the earliest, not the first listed
    assert h.cut_at_stops("a Q: b\n\nc", ["\n\n", "Q:"]) == "a "
    assert h.cut_at_stops("abc", []) == "abc"
    assert h.cut_at_stops("abc", ["", "x"]) == "abc"
    assert h.cut_at_stops("日本語。次", ["。"]) == "日本語"
    assert h.cut_at_stops("stop", ["stop"]) == ""


# ---------------------------------------------------------------------------------------------
# reordering


def test_sort_restore_chunks_group():
    keys = [3, 1, 2, 1]
    order = h.sort_order(keys)
    assert order == [1, 3, 2, 0]  # stable for the two 1s
    assert h.restore([keys[i] * 10 for i in order], order) == [30, 10, 20, 10]
    assert h.chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert h.chunks([], 3) == []
    assert h.group_by(["b", "a", "b", "c", "a"]) == [[0, 2], [1, 4], [3]]
    with pytest.raises(ValueError):
        h.restore([1], [0, 1])
    with pytest.raises(ValueError):
        h.chunks([1], 0)


def test_loglik_schedule_dedups_and_sorts_longest_first():
    reqs = [([1], [2]), ([1, 2, 3], [4]), ([1], [2]), ([5, 6], [7, 8]), ([1, 2], [3])]
    distinct, which = h.loglik_schedule(reqs)
    assert distinct == [([1, 2, 3], [4]), ([5, 6], [7, 8]), ([1, 2], [3]), ([1], [2])]
    assert which == [3, 0, 3, 1, 2]
    assert [distinct[w] for w in which] == reqs


def test_merge_report_sums_bytes_over_calls():
    rep = {"device_name": "CPU", "kv_policy": "h2o", "kv_dtype": "F16", "tokens_per_s": 5.0,
           "offload": {"policy": {"percent": [50, 50]}, "bytes_moved": {"host_to_device": 10, "disk_to_host": 0}}}
    t = h.merge_report({}, rep)
    t = h.merge_report(t, None)
    t = h.merge_report(t, dict(rep, offload={"policy": {"percent": [50, 50]}, "bytes_moved": {"host_to_device": 5}}))
    assert t == {"engine_calls": 3, "device_name": "CPU", "kv_policy": "h2o", "kv_dtype": "F16",
                 "offload_policy": {"percent": [50, 50]}, "offload_bytes_moved": {"host_to_device": 15, "disk_to_host": 0}}
    assert h.merge_report({}, {"kv_policy": "full"}) == {"engine_calls": 1, "kv_policy": "full"}


# ---------------------------------------------------------------------------------------------
# --model_args


def test_parse_model_args_as_lm_eval_passes_them():
    # exactly what lm-eval 0.4.13 hands the model for
    # --model_args 'pretrained=x,percent=0 100 100 0 100 0,heavy_ratio=0.1,cpu_cache_compute=true,gpu_mem=16GiB'
    a = h.parse_model_args({"pretrained": "x", "percent": "0 100 100 0 100 0", "heavy_ratio": 0.1,
                            "cpu_cache_compute": True, "gpu_mem": "16GiB", "kv_policy": "h2o",
                            "batch_size": 1, "device": "cuda:0"})
    assert a.model == "x"
    assert a.llm_kwargs == {"device": "auto", "batch_size": 1, "percent": [0, 100, 100, 0, 100, 0],
                            "heavy_ratio": 0.1, "cpu_cache_compute": True, "gpu_mem": "16GiB", "kv_policy": "h2o"}
    assert (a.max_length, a.max_gen_toks, a.add_bos_token, a.prefix_token_id, a.seed) == (None, 256, None, None, 0)


def test_parse_model_args_strings_and_adapter_options():
    a = h.parse_model_args({"pretrained": "m", "batch_size": "4", "device": "cpu", "threads": "2",
                            "compress_weight": "1", "compress_cache": "off", "recent_budget": "64",
                            "kv_dtype": "f16", "percent": [30, 70, 0, 100, 0, 100], "max_length": "512",
                            "max_gen_toks": 32, "add_bos_token": "false", "prefix_token_id": 2, "seed": "3",
                            "sink_tokens": "4", "heavy_ratio": "1e-1", "tokenizer": "/tok", "chunk_size": "64"})
    assert a.llm_kwargs == {"device": "cpu", "batch_size": 4, "threads": 2, "tokenizer": "/tok",
                            "compress_weight": True, "compress_cache": False, "recent_budget": 64,
                            "kv_dtype": "f16", "percent": [30, 70, 0, 100, 0, 100], "sink_tokens": 4,
                            "heavy_ratio": 0.1}
    assert (a.max_length, a.max_gen_toks, a.add_bos_token, a.prefix_token_id, a.seed, a.chunk_size) == \
        (512, 32, False, 2, 3, 64)


def test_parse_model_args_device_and_batch_size():
    dev = lambda **kw: h.parse_model_args({"pretrained": "m", **kw}).llm_kwargs  # noqa: E731
    assert dev()["device"] == "auto" and "batch_size" not in dev()
    assert dev(device="cuda")["device"] == "auto"
    assert dev(device="cuda:0", flexh2o_device="cuda")["device"] == "cuda"
    assert dev(device="auto")["device"] == "auto"
    assert "batch_size" not in dev(batch_size="auto")
    assert dev(batch_size="auto:4", max_batch_size=16)["batch_size"] == 16
    with pytest.raises(RequestError, match="'mps'"):
        dev(device="mps")
    with pytest.raises(RequestError, match="flexh2o_device must be cpu, cuda or auto"):
        dev(flexh2o_device="gpu")
    with pytest.raises(RequestError, match="batch_size must be >= 1"):
        dev(batch_size=0)


def test_parse_model_args_errors():
    with pytest.raises(RequestError, match="needs pretrained="):
        h.parse_model_args({"kv_policy": "h2o"})
    with pytest.raises(RequestError, match=r"percent: 'x' in '0 100 x' is not a number"):
        h.parse_model_args({"pretrained": "m", "percent": "0 100 x"})
    with pytest.raises(RequestError, match="cpu_cache_compute must be true or false, got 'maybe'"):
        h.parse_model_args({"pretrained": "m", "cpu_cache_compute": "maybe"})
    with pytest.raises(RequestError, match="max_length must be an integer, got 1.5"):
        h.parse_model_args({"pretrained": "m", "max_length": 1.5})


def test_parse_value():
    assert [h.parse_value(v) for v in ["true", "FALSE", "-3", "0.25", "1e-3", "16GiB", "inf", " 7 ", 5]] == \
        [True, False, -3, 0.25, 0.001, "16GiB", "inf", 7, 5]


# ---------------------------------------------------------------------------------------------
# HarnessAdapter over a fake LLM: what reaches the LLM, and results back in request order


def test_adapter_loglikelihood_requests_and_order():
    llm = FakeLLM(max_length=16)
    ad = HarnessAdapter(llm)
    pairs = [("The cat", " sat"), ("", " sat"), ("The cat ", "sat"), ("Q:\n", "A B"), ("The cat", " sat")]
    got = ad.loglikelihood(pairs)
    i = lambda *pieces: [llm.index[p] for p in pieces]  # noqa: E731
    cat = (i("<s>", "The", " cat"), i(" sat"))  # worked out by hand: BOS + context | continuation
    empty = (i("<s>"), i(" sat"))
    q = (i("<s>", "Q", ":"), i("\n", "A", " B"))
    assert got == [llm.score(*cat), llm.score(*empty), llm.score(*cat), llm.score(*q), llm.score(*cat)]
    (name, sent), = llm.calls  # one call; the duplicates scored once; longest first
    assert name == "loglikelihood"
    assert sent == [q, cat, empty]


def test_streaming_reaches_every_loglikelihood_call():
    a = h.parse_model_args({"pretrained": "m", "streaming": "true", "kv_policy": "h2o"})
    assert a.streaming is True and "streaming" not in a.llm_kwargs
    assert h.parse_model_args({"pretrained": "m"}).streaming is False
    with pytest.raises(RequestError, match="streaming must be true or false"):
        h.parse_model_args({"pretrained": "m", "streaming": "maybe"})
    llm = FakeLLM(max_length=16)
    HarnessAdapter(llm).loglikelihood([("The cat", " sat")])
    HarnessAdapter(llm, streaming=True).loglikelihood([("The cat", " sat")])
    assert llm.streamed == [False, True]


def test_adapter_loglikelihood_chunks_and_left_truncation():
    llm = FakeLLM(max_length=6)
    ad = HarnessAdapter(llm, chunk_size=2)
    text = "a b c d e f g h"  # 8 pieces: with BOS and the continuation, 11 ids > 6 + 1
    pairs = [(text, " x y"), ("a", " b"), ("a b", " c"), ("a b c", " d")]
    got = ad.loglikelihood(pairs)
    i = lambda *pieces: [llm.index[p] for p in pieces]  # noqa: E731
    long = (i(" d", " e", " f", " g", " h"), i(" x", " y"))  # the last 7 ids: BOS, a .. c dropped
    assert got[0] == llm.score(*long)
    assert got[1:] == [llm.score(i("<s>", "a"), i(" b")), llm.score(i("<s>", "a", " b"), i(" c")),
                       llm.score(i("<s>", "a", " b", " c"), i(" d"))]
    assert [len(c[1]) for c in llm.calls] == [2, 2]
    assert llm.calls[0][1][0] == long
    with pytest.raises(RequestError, match="loglikelihood request 1: continuation is 7 tokens"):
        ad.loglikelihood([("a", " b"), ("a", " b c d e f g h")])
    with pytest.raises(RequestError, match=r"loglikelihood request 0: continuation '' \(after context 'a'\) encodes to no tokens"):
        ad.loglikelihood([("a", "")])


def test_adapter_options():
    llm = FakeLLM(max_length=16)
    ad = HarnessAdapter(llm, add_bos_token=False, prefix_token_id=7, max_length=8)
    assert ad.max_length == 8 and ad.vocab.bos_id is None and ad.vocab.prefix_id == 7
    assert ad.eos_text == "</s>"
    with pytest.raises(RequestError, match=r"max_length 17 must be in \[1, the model's 16\]"):
        HarnessAdapter(llm, max_length=17)
    assert HarnessAdapter(FakeLLM(bos=False)).vocab.prefix_id == 1  # EOS stands in for BOS


def test_adapter_adds_bos_as_the_tokenizer_does():
    # HFLM's default: BOS before contexts only where the tokenizer adds it to text (SmolLM2's has
    # a BOS token it does not add); add_bos_token forces it either way. The rolling prefix stays BOS.
    for adds, forced, want in [(True, None, True), (False, None, False), (False, True, True), (True, False, False)]:
        llm = FakeLLM(adds_bos=adds)
        ad = HarnessAdapter(llm, add_bos_token=forced)
        assert (ad.vocab.bos_id == 0) == want, (adds, forced)
        assert ad.vocab.prefix_id == 0
        ctx, _ = ad.encode_requests([("a b", " c")])[0]
        assert ctx == ([0] if want else []) + llm.encode("a b", add_special=False), (adds, forced)
    # A tokenizer that adds only EOS, whose id is BOS's (encode("") is [BOS]): no BOS in front.
    assert HarnessAdapter(FakeLLM(adds_bos=False, suffix=[0])).vocab.bos_id is None


def test_adapter_rolling_windows_reach_the_right_calls():
    # Without BOS (add_bos_token=False, or a tokenizer that adds none): the text's own tokens.
    llm = FakeLLM(max_length=4)
    ad = HarnessAdapter(llm, chunk_size=100, add_bos_token=False)
    text = "a b c d e f g h i j"  # 10 pieces: windows as in the documented example
    t = llm.encode(text, add_special=False)
    got = ad.loglikelihood_rolling([text, "a b", ""])
    windows = [([0], t[0:4]), ([t[3]], t[4:8]), (t[5:8], t[8:10])]
    assert got[0] == pytest.approx(sum(llm.score(c, x)[0] for c, x in windows), abs=1e-12)
    assert got[1] == pytest.approx(llm.score([0], t[0:2])[0], abs=1e-12)
    assert got[2] == 0.0
    assert llm.calls == [("loglikelihood_rolling", [[0] + t[0:4], [t[3]] + t[4:8], [0] + t[0:2]]),
                         ("loglikelihood", [windows[2]])]


def test_adapter_rolling_scores_the_bos_the_tokenizer_adds_as_lm_eval_does():
    # lm-eval 0.4.13's models window tok_encode(text), which starts with the BOS the tokenizer adds,
    # after the prefix token: the first window predicts that BOS too (its hf model's sums).
    for adds, want_bos in [(True, True), (False, False)]:
        llm = FakeLLM(max_length=4, adds_bos=adds)
        ad = HarnessAdapter(llm, chunk_size=100)
        t = ([0] if want_bos else []) + llm.encode("a b c", add_special=False)
        got = ad.loglikelihood_rolling(["a b c", "<s>a b c" if want_bos else "a b c", ""])
        assert got[0] == pytest.approx(llm.score([0], t)[0], abs=1e-12), adds
        assert got[1] == got[0]  # a text that starts with BOS's own text gets no second one
        assert got[2] == (pytest.approx(llm.score([0], [0])[0], abs=1e-12) if want_bos else 0.0), adds


def test_adapter_sums_the_engine_reports():
    rep = {"kv_policy": "h2o", "offload": {"policy": {}, "bytes_moved": {"host_to_device": 7}}}
    ad = HarnessAdapter(FakeLLM(max_length=8, report=rep, script=[" z"]), chunk_size=1)
    ad.loglikelihood([("a", " b"), ("a b", " c")])
    ad.loglikelihood_rolling(["a b"])
    ad.generate_until([("a", {"max_gen_toks": 2})])
    assert ad.engine == {"engine_calls": 4, "kv_policy": "h2o", "offload_policy": {},
                         "offload_bytes_moved": {"host_to_device": 28}}


def test_adapter_rolling_needs_a_prefix():
    with pytest.raises(RequestError, match="needs a prefix token"):
        HarnessAdapter(FakeLLM(bos=False, eos=False)).loglikelihood_rolling(["a"])


def test_adapter_generate_until_drops_whichever_end_id_ended_the_answer():
    # Gemma's instruct models end a turn with <end_of_turn>, not their tokenizer's EOS: the answer
    # is the text before it (it kept "<eot>" while only the EOS's text was cut).
    llm = FakeLLM(max_length=16, script=[" one", "<eot>", " two"], more_eos=("<eot>",))
    assert HarnessAdapter(llm, max_gen_toks=6).generate_until([("a", {"until": ["\n"]})]) == [" one"]


def test_adapter_generate_until_groups_cuts_and_restores_order():
    llm = FakeLLM(max_length=16, script=[" one", "\n", " two", "</s>", " three"])
    ad = HarnessAdapter(llm, max_gen_toks=6)
    reqs = [("a", {"until": ["\n"]}),
            ("a b c", {"until": ["two"], "do_sample": True, "temperature": 0.5, "max_gen_toks": 4}),
            ("a b", {"until": ["\n"]}),
            ("a", {}),
            ("x", {"until": "zzz", "max_gen_toks": 3})]
    assert ad.generate_until(reqs) == [" one", " one\n ", " one", " one\n two", " one\n two"]
    i = lambda *pieces: [llm.index[p] for p in pieces]  # noqa: E731
    greedy6 = dict(max_new_tokens=6, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=[])
    assert llm.calls == [
        ("generate", [i("<s>", "a", " b"), i("<s>", "a")], dict(greedy6, stop=["\n"])),  # longest prompt first
        ("generate", [i("<s>", "a", " b", " c")], dict(greedy6, max_new_tokens=4, temperature=0.5, stop=["two"])),
        ("generate", [i("<s>", "a")], greedy6),
        ("generate", [i("<s>", "x")], dict(greedy6, max_new_tokens=3, stop=["zzz"])),
    ]
    with pytest.raises(RequestError, match=r"generate_until request 1: generation kwargs \['num_beams'\]"):
        ad.generate_until([("a", {}), ("b", {"num_beams": 2})])


def test_gen_kwargs_min_p_and_repetition_penalty_reach_the_engine():
    g = h.parse_gen_kwargs({"min_p": 0.1, "repetition_penalty": 1.3}, 8)
    assert (g.min_p, g.repetition_penalty) == (0.1, 1.3)
    with pytest.raises(RequestError, match=r"min_p must be in \[0, 1\], got 1.5"):
        h.parse_gen_kwargs({"min_p": 1.5}, 8)
    with pytest.raises(RequestError, match=r"repetition_penalty must be > 0 \(1 = off\), got 0.0"):
        h.parse_gen_kwargs({"repetition_penalty": 0}, 8)
    llm = FakeLLM(max_length=16, script=[" one"])
    HarnessAdapter(llm, max_gen_toks=2).generate_until([("a", {"repetition_penalty": 1.3}), ("a", {"min_p": 0.2}),
                                                        ("a", {})])
    kws = [c[2] for c in llm.calls]
    assert [(k.get("min_p"), k.get("repetition_penalty")) for k in kws] == [(None, 1.3), (0.2, None), (None, None)]


def test_adapter_generate_truncates_the_prompt_for_the_new_tokens():
    llm = FakeLLM(max_length=8, script=[" z"] * 8)
    got = HarnessAdapter(llm, max_gen_toks=5).generate_until([("a b c d e f", {})])
    assert got == [" z" * 5]
    assert llm.calls[0][1] == [[llm.index[p] for p in (" d", " e", " f")]]


# ---------------------------------------------------------------------------------------------
# The LM class (only where lm_eval is installed: a developer venv, not CI)


def _lm_module():
    pytest.importorskip("lm_eval")
    return importlib.import_module(_PKG + ".lm_eval_model")


def test_lm_class_is_registered_and_plumbs_instances():
    mod = _lm_module()
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    assert get_model("flexh2o") is mod.FlexH2OLM
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models are still there
    llm = FakeLLM(max_length=16, script=[" yes", "\n"])
    lm = mod.FlexH2OLM(llm=llm, max_gen_toks=4)
    ref = HarnessAdapter(FakeLLM(max_length=16, script=[" yes", "\n"]), max_gen_toks=4)
    mk = lambda kind, args, k: Instance(request_type=kind, doc={}, arguments=args, idx=k)  # noqa: E731
    pairs = [("The cat", " sat"), ("", " mat"), ("The cat ", "sat")]
    assert lm.loglikelihood([mk("loglikelihood", p, k) for k, p in enumerate(pairs)], disable_tqdm=True) == \
        ref.loglikelihood(pairs)
    texts = ["a b c", "d e f g h i j k l m n o p q r s t u v"]
    assert lm.loglikelihood_rolling([mk("loglikelihood_rolling", (t,), k) for k, t in enumerate(texts)],
                                    disable_tqdm=True) == ref.loglikelihood_rolling(texts)
    gens = [("Q: a", {"until": ["\n"]}), ("Q: b", {"until": ["yes"]})]
    assert lm.generate_until([mk("generate_until", g, k) for k, g in enumerate(gens)], disable_tqdm=True) == \
        [" yes", " "]
    assert (lm.max_length, lm.max_gen_toks, lm.eot_token_id, lm.prefix_token_id, lm.tokenizer_name) == \
        (16, 4, 1, 0, "fake")
    assert lm.apply_chat_template([{"role": "user", "content": "hi"}]) == "<user>hi<assistant>"
    assert lm.get_model_info() == {"flexh2o_model": "fake", "flexh2o_llm_flags": {"device": "auto"},
                                   "flexh2o_engine": {"engine_calls": 5}}  # 1 + 2 rolling + 2 generate
    with pytest.raises(TypeError, match=r"takes no model or LLM flags, got \['pretrained', 'kv_policy'\]"):
        mod.FlexH2OLM(pretrained="/m", llm=llm, kv_policy="h2o", device="cpu", batch_size=1)


def test_lm_class_builds_the_llm_from_model_args(monkeypatch):
    mod = _lm_module()
    built = {}

    class RecordingLLM(FakeLLM):
        def __init__(self, model, **kwargs):
            super().__init__(max_length=32)
            built.update(model=model, **kwargs)

    monkeypatch.setitem(sys.modules, "flexh2o", types.SimpleNamespace(LLM=RecordingLLM))
    lm = mod.FlexH2OLM.create_from_arg_string(
        "pretrained=/m,kv_policy=h2o,heavy_ratio=0.1,recent_ratio=0.1,percent=0 100 100 0 100 0,"
        "cpu_cache_compute=true,gpu_mem=16GiB,max_length=24,chunk_size=8",
        {"batch_size": "4", "max_batch_size": None, "device": "cpu"})
    assert built == {"model": "/m", "device": "cpu", "batch_size": 4, "kv_policy": "h2o", "heavy_ratio": 0.1,
                     "recent_ratio": 0.1, "percent": [0, 100, 100, 0, 100, 0], "cpu_cache_compute": True,
                     "gpu_mem": "16GiB"}
    assert (lm.max_length, lm.adapter.chunk_size) == (24, 8)


def test_the_lm_eval_command_without_lm_eval_says_how_to_install_it(monkeypatch, capsys):
    # `pip install flexh2o` installs flexh2o-lm-eval without the optional lm-eval: a clear exit 2,
    # not a traceback. (lm_eval.__main__ made unimportable whether or not lm-eval is here.)
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.setitem(sys.modules, "lm_eval.__main__", None)
    from flexh2o import lm_eval as command
    with pytest.raises(SystemExit) as e:
        command.main(["--help"])
    assert e.value.code == 2
    assert "pip install 'flexh2o[lm-eval]'" in capsys.readouterr().err
