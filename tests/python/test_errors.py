"""LLM() errors: an unknown keyword is a TypeError naming it; a bad flag value, a missing
model and a bad request are flexh2o.Error with the message the CLI prints for the same input."""

import pytest

import flexh2o
from conftest import TINY, run_binary


def cli_error(*flags):
    """The message the binary prints for `generate` with these flags (after "flexh2o: error: ")."""
    r = run_binary(["generate", "-m", TINY["opt"], "--prompt", "x", "--device", "cpu", *flags])
    assert r.returncode in (1, 2), r.stderr
    return r.stderr


def test_unknown_flag_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'heavy_ration'"):
        flexh2o.LLM(str(TINY["opt"]), heavy_ration=0.1)
    with pytest.raises(TypeError, match="'max_new_tokens'"):  # a generate() parameter, not a flag
        flexh2o.LLM(str(TINY["opt"]), max_new_tokens=3)


@pytest.mark.parametrize("kw, flags", [
    (dict(kv_policy="h2o", heavy_ratio=2.0, recent_ratio=0.1), ["--kv-policy", "h2o", "--heavy-ratio", "2.0",
                                                                 "--recent-ratio", "0.1"]),
    (dict(kv_policy="lru"), ["--kv-policy", "lru"]),
    (dict(kv_seed=3), ["--kv-seed", "3"]),
    (dict(kv_dtype="f8"), ["--kv-dtype", "f8"]),
])
def test_bad_value_has_the_cli_message(kw, flags):
    with pytest.raises(flexh2o.Error) as e:
        flexh2o.LLM(str(TINY["opt"]), device="cpu", **kw)
    msg = str(e.value)
    assert msg and f"flexh2o: error: {msg}\n" in cli_error(*flags)


def test_parse_error_has_cli11_message():
    # Five numbers for --percent: CLI11's own message, as the CLI prints it.
    with pytest.raises(flexh2o.Error) as e:
        flexh2o.LLM(str(TINY["opt"]), device="cpu", percent=[0, 100, 100, 0, 100])
    assert str(e.value) and str(e.value) in cli_error("--percent", "0", "100", "100", "0", "100")
    with pytest.raises(flexh2o.Error, match="--heavy-ratio"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", kv_policy="h2o", heavy_ratio="lots")
    # A size is checked as the flags are parsed, with parse_bytes' message.
    for value, says in (("lots", '"lots" is not a size'), ("0.5", '"0.5" is a fraction of a byte')):
        with pytest.raises(flexh2o.Error) as e:
            flexh2o.LLM(str(TINY["opt"]), device="cpu", gpu_mem=value)
        assert f"--gpu-mem: {says}" in str(e.value) and str(e.value) in cli_error("--gpu-mem", value)
    # A true/false flag with another word is refused at parse time, in memory as when offloading.
    for flag in ("overlap", "sep_layer", "pin_weight"):
        with pytest.raises(flexh2o.Error) as e:
            flexh2o.LLM(str(TINY["opt"]), device="cpu", **{flag: "maybe"})
        dashed = "--" + flag.replace("_", "-")
        assert f'{dashed}: must be true or false (or 1/0, on/off, yes/no), got "maybe"' in str(e.value)
        assert str(e.value) in cli_error(dashed, "maybe")


def test_a_message_quoting_invalid_utf8_is_kept(tmp_path):
    # A config.json with a byte that is not UTF-8 (a damaged download): the parser's message
    # quotes it; Python's str would be empty without the escape, and the CLI prints the same.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_bytes(b'{"model_type": "ll\xff"}')
    with pytest.raises(flexh2o.Error) as e:
        flexh2o.LLM(str(bad), device="cpu")
    assert "config.json" in str(e.value) and "\\xff" in str(e.value), repr(str(e.value))
    r = run_binary(["generate", "-m", str(bad), "--prompt", "x", "--device", "cpu"])
    assert r.returncode == 1 and f"flexh2o: error: {e.value}\n" in r.stderr, r.stderr


def test_missing_model_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(flexh2o.Error, match="no such model directory: " + str(missing)):
        flexh2o.LLM(str(missing), device="cpu")
    assert isinstance(flexh2o.Error("x"), RuntimeError)


def test_bad_requests(llms):
    llm = llms["opt"]
    with pytest.raises(flexh2o.Error, match="prompt 1: .*outside the vocabulary"):
        llm.generate([[2, 5], [2, 999999]], max_new_tokens=2)
    # An empty prompt is the BOS alone, as transformers' tokenizer gives it.
    assert llm.generate([""], max_new_tokens=3, temperature=0.0)[0].token_ids == \
        llm.generate([[llm.bos_id]], max_new_tokens=3, temperature=0.0)[0].token_ids
    with pytest.raises(flexh2o.Error, match="request 0: empty continuation"):
        llm.loglikelihood([([2, 5], [])])
    with pytest.raises(flexh2o.Error, match="sequence 1 is empty"):
        llm.loglikelihood_rolling([[2, 5], []])
    # Too long: said of the sequence as given (score() makes it a request of context + continuation).
    n = llm.max_length + 2
    with pytest.raises(flexh2o.Error, match=f"sequence 1 is {n} tokens; scoring it reads {n - 1} of them, more "
                                            f"than the model's {llm.max_length} positions"):
        llm.score([[2, 5], [2] * n])
    with pytest.raises(flexh2o.Error, match=f"sequence 1 is {n} tokens; scoring it reads {n - 1} of them"):
        llm.loglikelihood_rolling([[2, 5], [2] * n])
    with pytest.raises(flexh2o.Error, match=r"sequence 1: token id 99999 is outside the vocabulary"):
        llm.loglikelihood_rolling([[2, 5], [2, 99999]])
    with pytest.raises(flexh2o.Error, match="device"):
        flexh2o.LLM(str(TINY["opt"]), device="tpu")
    assert llm.generate([], max_new_tokens=2) == []
    with pytest.raises(flexh2o.Error, match="batch_size must be >= 1, got 0"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=0)
    with pytest.raises(flexh2o.Error, match=r"threads must be in \[0, \d+\] .*got -2"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", threads=-2)
    with pytest.raises(flexh2o.Error, match=r"threads must be in .*hardware threads here\), got 100000"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", threads=100000)
    # A profile only --policy auto reads is refused, not ignored.
    with pytest.raises(flexh2o.Error, match="--hardware h200 is the profile --policy auto plans for"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", hardware="h200")
    with pytest.raises(flexh2o.Error, match="this model has no tokenizer"):
        flexh2o.LLM("opt-125m", device="cpu").generate("hi")  # a preset: dummy weights, no tokenizer
