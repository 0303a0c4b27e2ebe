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
