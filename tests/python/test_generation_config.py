"""A model's generation_config.json sets generate()'s sampling defaults, read by the CLI's own
reader: LLM.generate gives the tokens `flexh2o generate` gives for the same prompt and seed,
arguments override the file, generation_config="none" ignores it, and the lm-eval adapter keeps
the tasks' settings."""

import json
import shutil

import pytest

import flexh2o
from conftest import TINY, cli_generate, run_binary, run_module
from flexh2o.lm_eval_adapter import HarnessAdapter

PROMPT = "In the beginning God created"
FILE_VALUES = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.2}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """tiny-opt whose generation_config.json sets sampling values."""
    d = tmp_path_factory.mktemp("gc") / "tiny-opt"
    shutil.copytree(TINY["opt"], d)
    cfg = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**cfg, **FILE_VALUES}))
    return d


def test_the_file_sets_the_defaults_as_in_the_cli(model, tmp_path, capsys):
    llm = flexh2o.LLM(str(model), device="cpu")
    notice = capsys.readouterr().err
    assert llm.generation_defaults == FILE_VALUES
    taken = "temperature 0.6, top_p 0.9, repetition_penalty 1.2"
    assert f"flexh2o: sampling defaults from {model / 'generation_config.json'}: {taken} (generate()'s arguments " \
           'override them; generation_config="none" ignores the file)' in notice
    assert f"generation_config.json: {taken} (flags" in run_binary(
        ["generate", "-m", model, "--prompt", "x", "-n", "1", "--device", "cpu"]).stderr
    greedy = llm.generate(PROMPT, max_new_tokens=8, temperature=0.0, top_p=1.0, repetition_penalty=1.0)
    for seed in (3, 11):
        (got,) = llm.generate(PROMPT, max_new_tokens=8, seed=seed)
        (tmp_path / str(seed)).mkdir()
        (want,) = cli_generate(tmp_path / str(seed), model, [{"prompt": PROMPT}], "-n", "8", "--seed", seed)
        assert got.token_ids == want["token_ids"] and got.text == want["text"]
        assert got.token_ids != greedy[0].token_ids  # it sampled
    assert greedy == flexh2o.LLM(str(TINY["opt"]), device="cpu").generate(PROMPT, max_new_tokens=8)


def test_every_listed_eos_id_ends_a_sequence(tmp_path):
    d = tmp_path / "tiny-opt"
    shutil.copytree(TINY["opt"], d)
    base = flexh2o.LLM(str(d), device="cpu")
    ids = base.generate(PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)[0].token_ids
    assert base.eos_id is not None and base.eos_id not in ids  # the greedy text runs to its length
    end = ids[3]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [base.eos_id, end]}))
    llm = flexh2o.LLM(str(d), device="cpu")
    assert llm.eos_ids == [base.eos_id, end] and llm.eos_id == base.eos_id
    (cut,) = llm.generate(PROMPT, max_new_tokens=10, temperature=0.0)
    assert cut.token_ids == ids[:ids.index(end) + 1] and cut.finish_reason == "eos"
    # generation_config="none" drops the file's sampling defaults, not the model's ends (as vLLM).
    none = flexh2o.LLM(str(d), device="cpu", generation_config="none")
    assert none.eos_ids == [base.eos_id, end]
    assert none.generate(PROMPT, max_new_tokens=10, temperature=0.0)[0].token_ids == cut.token_ids
    (d / "generation_config.json").write_text('{"eos_token_id": "x"}')
    assert flexh2o.LLM(str(d), device="cpu", generation_config="none").eos_ids == [base.eos_id]


def test_arguments_override_the_file(model, tmp_path):
    llm = flexh2o.LLM(str(model), device="cpu")
    # Greedy, with the file's top_p and repetition penalty still applied, as the CLI's flag.
    got = llm.generate(PROMPT, max_new_tokens=8, temperature=0.0)
    want = cli_generate(tmp_path, model, [{"prompt": PROMPT}], "-n", "8", "--temperature", "0")
    assert got[0].token_ids == want[0]["token_ids"]
    assert got != llm.generate(PROMPT, max_new_tokens=8, temperature=0.0, repetition_penalty=1.0)


def test_none_ignores_the_file(model, capsys):
    llm = flexh2o.LLM(str(model), device="cpu", generation_config="none")
    assert llm.generation_defaults == {} and "sampling defaults" not in capsys.readouterr().err
    builtin = flexh2o.LLM(str(TINY["opt"]), device="cpu")
    assert builtin.generation_defaults == {}  # tiny-opt's own file has no sampling values
    for seed in (3, 11):
        assert llm.generate(PROMPT, max_new_tokens=8, seed=seed) == builtin.generate(PROMPT, max_new_tokens=8,
                                                                                      seed=seed)


def test_a_bad_file_or_setting_is_an_error(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(TINY["opt"], d)
    (d / "generation_config.json").write_text('{"temperature": "hot"}')
    with pytest.raises(flexh2o.Error, match='generation_config.json: "temperature" must be a number, got "hot"; '
                                            'fix it or pass generation_config="none"'):
        flexh2o.LLM(str(d), device="cpu")
    assert flexh2o.LLM(str(d), device="cpu", generation_config="none").generation_defaults == {}
    (d / "generation_config.json").write_text('{"top_k": 1.5}')  # a count: not cut to 1 unsaid
    with pytest.raises(flexh2o.Error, match=r'generation_config.json: "top_k" must be an integer in '
                                            r'\[-1, 2147483647\], got 1.5; fix it or pass generation_config="none"'):
        flexh2o.LLM(str(d), device="cpu")
    (d / "generation_config.json").write_text('{"top_k": 40.0}')  # integral: taken
    assert flexh2o.LLM(str(d), device="cpu").generation_defaults["top_k"] == 40
    with pytest.raises(flexh2o.Error, match='generation_config must be "auto" or "none", got "yes"'):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", generation_config="yes")


def test_lm_eval_keeps_the_tasks_settings(model):
    # A task's greedy generation without penalties stays so whatever the model's file says.
    reqs = [(PROMPT, {"until": ["\n\n"], "max_gen_toks": 8})]
    with_file = HarnessAdapter(flexh2o.LLM(str(model), device="cpu")).generate_until(reqs)
    plain = HarnessAdapter(flexh2o.LLM(str(model), device="cpu", generation_config="none")).generate_until(reqs)
    assert with_file == plain


def test_the_server_does_not_read_the_file(model):
    # Its requests take OpenAI's defaults; the file is neither read nor announced.
    r = run_module(["serve", "-m", model, "--device", "cpu", "--port", "0", "--percent", "100", "0", "100", "0",
                    "100", "0", "--gpu-mem", "64KiB"], timeout=120)
    assert r.returncode == 1 and "budget" in r.stderr and "sampling defaults" not in r.stderr, r.stderr
    r = run_module(["serve", "-m", model, "--device", "cpu", "--port", "0", "--generation-config", "auto"])
    assert r.returncode == 2 and "--generation-config is not taken" in r.stderr, r.stderr
