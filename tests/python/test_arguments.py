"""flexh2o.LLM's arguments: what each accepts (logprobs True/False, seeds of any size, a flat id
list as one prompt) and the flexh2o.Error a bad one gets, naming it, instead of pybind11's
"incompatible function arguments" dump or a silent truncation."""

import pytest

import flexh2o
from conftest import TINY

PROMPT = "In the beginning God created"


def test_logprobs_true_false_and_out_of_range(llms):
    llm = llms["opt"]
    kw = dict(max_new_tokens=4, ignore_eos=True)
    (off,) = llm.generate(PROMPT, **kw, logprobs=False)
    assert off.logprobs is None and off.top_logprobs is None
    (on,) = llm.generate(PROMPT, **kw, logprobs=True)
    assert len(on.logprobs) == 4 and on.top_logprobs is None  # the chosen tokens' only, as OpenAI chat's
    assert on == llm.generate(PROMPT, **kw, logprobs=0)[0]
    (two,) = llm.generate(PROMPT, **kw, logprobs=2)
    assert two.logprobs == on.logprobs and all(len(step) == 2 for step in two.top_logprobs)
    for bad in (-1, 21, 2.5, "3"):
        with pytest.raises(flexh2o.Error, match=r"logprobs must be None, False, True or an integer in \[0, 20\]"):
            llm.generate(PROMPT, **kw, logprobs=bad)


def test_seeds_are_taken_modulo_2_to_the_64(llms):
    llm = llms["opt"]
    kw = dict(max_new_tokens=8, temperature=1.0, ignore_eos=True)
    assert llm.generate(PROMPT, **kw, seed=-1) == llm.generate(PROMPT, **kw, seed=2**64 - 1)
    assert llm.generate(PROMPT, **kw, seed=2**70 + 5) == llm.generate(PROMPT, **kw, seed=5)


def test_a_flat_id_list_is_one_prompt(llms):
    llm = llms["opt"]
    ids = llm.encode("hi")
    assert llm.generate(ids, max_new_tokens=3) == llm.generate([ids], max_new_tokens=3)
    with pytest.raises(flexh2o.Error, match="mixes token ids with prompts"):
        llm.generate([5, "hi"], max_new_tokens=3)


@pytest.mark.parametrize("prompts, words", [
    ([[2, 2**40]], "prompt 0: token id 1099511627776 is outside the vocabulary"),
    ([[2, 5], [2, -2**40]], "prompt 1: token id -1099511627776 is outside the vocabulary"),
    ([[2, -5]], "token id -5 is outside the vocabulary"),  # the engine's check
    (["fine", "bad \ud800"], r"prompt 1 is not valid Unicode text: '\\ud800' at index 4"),
    ([[2, 5.0]], "prompt 0 must be a list of token ids \\(ints\\), got the item 5.0"),
    ([None], "prompt 0 must be a list of token ids, got None"),
    (b"hi", "decode them to str first"),
    (7, "prompts must be a string, a list of token ids or a list of those, got 7"),
])
def test_bad_prompts_are_named(llms, prompts, words):
    with pytest.raises(flexh2o.Error, match=words):
        llms["opt"].generate(prompts, max_new_tokens=2)


@pytest.mark.parametrize("kw, words", [
    (dict(max_new_tokens=3.7), "max_new_tokens must be an integer, got 3.7"),
    (dict(max_new_tokens=2**70), r"max_new_tokens must be in \[0, 2\*\*63 - 1\]"),
    (dict(top_k=2**40), "top_k must be in"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
    (dict(seed=1.5), "seed must be an integer, got 1.5"),
    (dict(stop=5), "stop must be a string or a list of strings, got 5"),
    (dict(stop=["ok", "\udfff"]), r"stop\[1\] is not valid Unicode text"),
    (dict(logit_bias={2**40: 1}), "logit_bias: token id 1099511627776 is outside the vocabulary"),
    (dict(logit_bias=[(5, 1)]), "logit_bias must be a dict"),
    (dict(logit_bias={"5": 1}), r"logit_bias keys must be token ids \(ints\), got the key '5'"),
])
def test_bad_generate_arguments_are_named(llms, kw, words):
    with pytest.raises(flexh2o.Error, match=words):
        llms["opt"].generate(PROMPT, **{"max_new_tokens": 2, **kw})


def test_integral_floats_are_counts(llms):
    llm = llms["opt"]
    assert llm.generate(PROMPT, max_new_tokens=3.0) == llm.generate(PROMPT, max_new_tokens=3)


def test_scoring_takes_token_ids(llms):
    llm = llms["opt"]
    with pytest.raises(flexh2o.Error, match=r"request 0 context must be a list of token ids, got str 'ctx' "
                                            r"\(encode text with llm.encode\(...\)\)"):
        llm.loglikelihood([("ctx", "cont")])
    with pytest.raises(flexh2o.Error, match="request 1 continuation: token id 1099511627776 is outside"):
        llm.loglikelihood([([2, 5], [6]), ([2, 5], [2**40])])
    with pytest.raises(flexh2o.Error, match=r"request 0 must be a \(context ids, continuation ids\) pair"):
        llm.loglikelihood([[2, 5, 6]])
    for method in (llm.loglikelihood_rolling, llm.score):
        with pytest.raises(flexh2o.Error, match="sequence 1: token id 1099511627776 is outside the vocabulary"):
            method([[2, 5], [2, 2**40]])
        with pytest.raises(flexh2o.Error, match=r"got one flat list of ids \(wrap it: \[ids\]\)"):
            method([2, 5, 6])
        with pytest.raises(flexh2o.Error, match="sequence 0 must be a list of token ids, got str"):
            method(["some text"])
    with pytest.raises(flexh2o.Error, match=r"top must be in \[0, 20\], got 1099511627776"):
        llm.score([[2, 5]], top=2**40)


def test_encode_and_decode_arguments(llms):
    llm = llms["opt"]
    with pytest.raises(flexh2o.Error, match="text is not valid Unicode text"):
        llm.encode("a\ud800")
    with pytest.raises(flexh2o.Error, match="text must be a string, got int"):
        llm.encode(5)
    with pytest.raises(flexh2o.Error, match="ids: token id 1099511627776 is outside the vocabulary"):
        llm.decode([2**40])
    with pytest.raises(flexh2o.Error, match="ids must be a list of token ids, got 5"):
        llm.decode(5)
    assert llm.decode(llm.encode("hi", add_special=False)) == "hi"


def test_ids_past_the_tokenizer_decode_to_no_text():
    # A model's table padded past its tokenizer (here opt-125m's 50272 rows over tiny-opt's 4096
    # tokens): sampling can draw such ids, and decoding them must not end an lm-eval run.
    llm = flexh2o.LLM("opt-125m", tokenizer=str(TINY["opt"]), device="cpu")
    ids = llm.encode("In the beginning", add_special=False)
    assert llm.decode([4096]) == ""
    assert llm.decode(ids[:1] + [4096, 50271] + ids[1:]) == llm.decode(ids)
    with pytest.raises(flexh2o.Error, match=r"decode: token id 50272 is outside the vocabulary \[0, 50272\)"):
        llm.decode([50272])


@pytest.mark.parametrize("kw, words", [
    (dict(batch_size=2**70), "batch_size must be in"),
    (dict(batch_size="x"), "batch_size must be an integer, got 'x'"),
    (dict(batch_size=2.5), "batch_size must be an integer, got 2.5"),
    (dict(threads=2**40), "threads must be in"),
    (dict(device=5), "device must be a string"),
])
def test_bad_constructor_arguments_are_named(kw, words):
    with pytest.raises(flexh2o.Error, match=words):
        flexh2o.LLM(str(TINY["opt"]), **{"device": "cpu", **kw})
