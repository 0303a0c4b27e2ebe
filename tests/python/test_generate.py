"""flexh2o.LLM.generate against the flexh2o binary's `generate` on the same prompts and
parameters: the same token ids, text and finish reasons, in memory, offloaded and with H2O."""

import pytest

import flexh2o
from conftest import TINY, cli_generate

PROMPTS = ["In the beginning God created", "And the earth was without form,", "Grace be unto you"]


def check_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, flexh2o.Completion)
        assert g.token_ids == w["token_ids"]
        assert g.text == w["text"]
        assert g.finish_reason == w["finish_reason"]


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_greedy_matches_cli(llms, tmp_path, model):
    got = llms[model].generate(PROMPTS, max_new_tokens=12)
    want = cli_generate(tmp_path, TINY[model], [{"prompt": p} for p in PROMPTS], "--greedy", "-n", "12")
    check_same(got, want)
    assert all(len(c.token_ids) > 0 for c in got)


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_seeded_sampling_matches_cli(llms, tmp_path, model):
    # Request i samples with seed + i, as the CLI's line i.
    kw = dict(max_new_tokens=10, temperature=0.9, top_k=40, top_p=0.95, seed=7)
    got = llms[model].generate(PROMPTS, **kw)
    want = cli_generate(tmp_path, TINY[model], [{"prompt": p} for p in PROMPTS], "-n", "10", "--temperature", "0.9",
                        "--top-k", "40", "--top-p", "0.95", "--seed", "7")
    check_same(got, want)
    assert got != llms[model].generate(PROMPTS, **{**kw, "seed": 8})  # the seed matters


def test_penalties_and_min_p_match_cli_and_change_the_text(llms, tmp_path):
    # The same sampler behind both; greedy with a repetition penalty leaves the tiny model's loop.
    llm = llms["llama"]
    kw = dict(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    plain = llm.generate(PROMPTS, **kw)
    got = llm.generate(PROMPTS, **kw, repetition_penalty=1.5)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want = cli_generate(tmp_path / "a", TINY["llama"], [{"prompt": p} for p in PROMPTS], "-n", "16", "--greedy",
                        "--ignore-eos", "--repetition-penalty", "1.5")
    check_same(got, want)
    assert [c.token_ids for c in got] != [c.token_ids for c in plain]
    sampled = dict(max_new_tokens=10, temperature=1.0, seed=3, min_p=0.1, presence_penalty=0.5,
                   frequency_penalty=0.3)
    got = llm.generate(PROMPTS, **sampled)
    want = cli_generate(tmp_path / "b", TINY["llama"], [{"prompt": p, "min_p": 0.1, "presence_penalty": 0.5,
                                                   "frequency_penalty": 0.3} for p in PROMPTS],
                        "-n", "10", "--seed", "3")
    check_same(got, want)
    with pytest.raises(Exception, match="repetition_penalty must be > 0"):
        llm.generate(PROMPTS, repetition_penalty=0.0)


def test_logit_bias_matches_cli_bans_and_forces(llms, tmp_path):
    llm = llms["opt"]
    kw = dict(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    plain = llm.generate(PROMPTS, **kw)
    banned = {plain[0].token_ids[0]: -100, plain[1].token_ids[0]: -100}
    got = llm.generate(PROMPTS, **kw, logit_bias=banned)
    assert got[0].token_ids[0] != plain[0].token_ids[0] and got[1].token_ids[0] != plain[1].token_ids[0]
    for c in got:
        assert not set(c.token_ids) & set(banned)
    want = cli_generate(tmp_path, TINY["opt"], [{"prompt": p, "logit_bias": {str(t): b for t, b in banned.items()}}
                                                for p in PROMPTS], "-n", "6", "--greedy", "--ignore-eos")
    check_same(got, want)
    forced = llm.generate(PROMPTS, max_new_tokens=4, temperature=1.0, seed=2, ignore_eos=True, logit_bias={77: 100})
    assert all(c.token_ids == [77] * 4 for c in forced)
    with pytest.raises(Exception, match="outside the vocabulary"):
        llm.generate(PROMPTS, logit_bias={llm.vocab_size: 1})


@pytest.mark.parametrize("model", ["opt", "llama"])
def test_eos_ends_the_text_without_its_own(llms, tmp_path, model):
    # As vLLM's text: EOS ("</s>" here, "<|im_end|>" for SmolLM2) stays in token_ids only.
    llm = llms[model]
    eos = llm.eos_id
    got = llm.generate(PROMPTS, max_new_tokens=4, temperature=0.0, logit_bias={eos: 100})
    assert [(c.token_ids, c.text, c.finish_reason) for c in got] == [([eos], "", "eos")] * len(PROMPTS)
    want = cli_generate(tmp_path, TINY[model], [{"prompt": p, "logit_bias": {str(eos): 100}} for p in PROMPTS],
                        "-n", "4", "--greedy")
    check_same(got, want)


def test_logprobs_sum_to_the_loglikelihood_of_the_generated_tokens(llms):
    # Two paths of the engine: decode steps (generate) and one teacher-forced pass (loglikelihood).
    llm = llms["opt"]
    got = llm.generate(PROMPTS, max_new_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    scores = llm.loglikelihood([(llm.encode(p), c.token_ids) for p, c in zip(PROMPTS, got)])
    for c, (ll, greedy) in zip(got, scores):
        assert len(c.logprobs) == len(c.token_ids) == 6
        assert abs(sum(c.logprobs) - ll) < 1e-3 * max(1.0, abs(ll)), (c.logprobs, ll)
        assert greedy
        assert [step[0][0] for step in c.top_logprobs] == c.token_ids
    plain = llm.generate(PROMPTS, max_new_tokens=6, temperature=0.0, ignore_eos=True)
    assert plain[0].logprobs is None and plain[0].top_logprobs is None
    assert [c.token_ids for c in plain] == [c.token_ids for c in got]


def test_id_prompts_are_used_exactly(llms, tmp_path):
    llm = llms["llama"]
    ids = [[5, 17, 300, 42], [llm.bos_id, 99, 100]]
    got = llm.generate(ids, max_new_tokens=8, ignore_eos=True)
    want = cli_generate(tmp_path, TINY["llama"], [{"prompt_ids": p} for p in ids], "--greedy", "-n", "8",
                        "--ignore-eos")
    check_same(got, want)
    assert [len(c.token_ids) for c in got] == [8, 8]
    assert all(c.finish_reason == "length" for c in got)


def test_text_prompt_gets_bos_like_the_cli(llms):
    llm = llms["llama"]
    text = PROMPTS[0]
    assert llm.encode(text)[0] == llm.bos_id
    assert llm.encode(text, add_special=False) == llm.encode(text)[1:]
    assert llm.generate(text, max_new_tokens=6) == llm.generate([llm.encode(text)], max_new_tokens=6)


def test_single_string_returns_a_list_of_one(llms):
    out = llms["opt"].generate("Hello", max_new_tokens=3)
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], flexh2o.Completion)
    with pytest.raises(Exception):  # frozen
        out[0].text = "x"


def test_offloaded_gives_the_in_memory_tokens(llms):
    off = flexh2o.LLM(str(TINY["opt"]), device="cpu", percent=[0, 100, 100, 0, 100, 0], gpu_batch_size=2,
                      num_gpu_batches=2, cpu_cache_compute=True, gpu_mem="64MiB", overlap=True)
    want = llms["opt"].generate(PROMPTS, max_new_tokens=10)
    assert off.generate(PROMPTS, max_new_tokens=10) == want
    rep = off.last_report
    assert rep["offload"]["policy"]["gpu_batch_size"] == 2
    assert rep["offload"]["bytes_moved"]["host_to_device"] > 0  # the weights stream from the host
    assert rep["generated_tokens"] == sum(len(c.token_ids) for c in want)


def test_batch_size_is_the_offloaded_block_unless_the_flags_set_it():
    # As the CLI's -b: batch_size sizes the block of an offloaded run; gpu_batch_size, which
    # lm-eval's always-passed batch_size must not override, wins where given.
    place = dict(device="cpu", percent=[0, 100, 100, 0, 100, 0])
    for kwargs, block in [({"batch_size": 3}, 3), ({"batch_size": 3, "gpu_batch_size": 2}, 2), ({}, 4)]:
        llm = flexh2o.LLM(str(TINY["opt"]), **place, **kwargs)
        llm.generate(PROMPTS, max_new_tokens=2)
        assert llm.last_report["batch_size"] == block, kwargs
    with pytest.raises(flexh2o.Error, match="batch_size must be >= 1"):
        flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=0)


def test_report_counts_each_call_of_a_reused_runner(tmp_path):
    # The runner placed by the first call is reused: each report counts its own call only, the
    # setup and the weights' placement (onto disk here) in the first.
    off = flexh2o.LLM(str(TINY["opt"]), device="cpu", percent=[0, 50, 100, 0, 100, 0], gpu_batch_size=2,
                      offload_dir=str(tmp_path))
    off._s.prepare(8, 8, 4)  # placed ahead of the first call, as the server does: still its report
    reps, whole = [], []
    for _ in range(3):
        off.generate(PROMPTS, max_new_tokens=5, ignore_eos=True)
        reps.append(off.last_report["offload"])
        whole.append(off.last_report)
    assert whole[0]["setup_seconds"] > 0 and reps[0]["weights_written"] > 0
    assert reps[0]["placement_disk_io_bytes"]["written"] > 0
    for later, rep in zip(whole[1:], reps[1:]):
        assert later["setup_seconds"] == 0 and rep["weights_written"] == rep["weights_reused"] == 0
        assert rep["placement_disk_io_bytes"] == {"read": 0, "written": 0}
    assert reps[1]["bytes_moved"] == reps[2]["bytes_moved"]
    assert reps[1]["token_steps"] == reps[2]["token_steps"] == reps[0]["token_steps"] > 0
    assert reps[1]["bytes_moved"]["host_to_device"] > 0
    assert 0 < reps[1]["schedule_wall_seconds"] and 0 < reps[1]["overlap_efficiency"] <= 1.0
    ((_, _),) = off.loglikelihood([(off.encode("Grace"), [5, 6])])  # a smaller workload: the same runner
    assert 0 < off.last_report["offload"]["token_steps"] < reps[1]["token_steps"]


def test_h2o_matches_cli(tmp_path):
    llm = flexh2o.LLM(str(TINY["llama"]), device="cpu", kv_policy="h2o", heavy_ratio=0.2, recent_ratio=0.2)
    got = llm.generate(PROMPTS, max_new_tokens=12, ignore_eos=True)
    want = cli_generate(tmp_path, TINY["llama"], [{"prompt": p} for p in PROMPTS], "--greedy", "-n", "12",
                        "--ignore-eos", "--kv-policy", "h2o", "--heavy-ratio", "0.2", "--recent-ratio", "0.2")
    check_same(got, want)
    assert llm.last_report["kv_policy"].startswith("h2o")


def test_last_report(llms):
    llm = llms["opt"]
    out = llm.generate(PROMPTS[:2], max_new_tokens=4, ignore_eos=True)
    rep = llm.last_report
    assert rep["requests"] == 2 and rep["finished_requests"] == 2
    assert rep["generated_tokens"] == 8 == sum(len(c.token_ids) for c in out)
    assert rep["device"] == "cpu" and rep["interrupted"] is False


def test_attributes(llms):
    llm = llms["llama"]
    assert llm.name == "tiny-llama"
    assert (llm.vocab_size, llm.max_length, llm.bos_id, llm.eos_id) == (4096, 1024, 0, 2)
    assert llm.decode(llm.encode("Grace be unto you", add_special=False)) == "Grace be unto you"
    assert llms["opt"].bos_id == 2  # OPT starts with </s>


def test_policy_auto_plans_once_per_fitting_workload(llms):
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", policy="auto", hardware="t4-paper", gpu_mem="64MiB")
    assert llm.generate(PROMPTS, max_new_tokens=6) == llms["opt"].generate(PROMPTS, max_new_tokens=6)
    assert "offload" in llm.last_report
    ((ll, _),) = llm.loglikelihood([(llm.encode("Grace"), [5, 6])])  # a smaller workload: the same runner
    ((want, _),) = llms["opt"].loglikelihood([(llm.encode("Grace"), [5, 6])])
    assert ll == pytest.approx(want, abs=1e-9)


def test_policy_auto_calls_of_two_shapes_in_turn_plan_twice(llms, capfd):
    # Many short prompts, then two long ones, in turn: the second plan covers both shapes, so the
    # engine is not planned and placed again on every call.
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", policy="auto", hardware="t4-paper", gpu_mem="64MiB")
    short, long = [[2, 100 + i] for i in range(20)], [[2] + [100 + i for i in range(120)]] * 2
    capfd.readouterr()
    for _ in range(3):
        assert llm.generate(short, max_new_tokens=4) == llms["opt"].generate(short, max_new_tokens=4)
        assert llm.generate(long, max_new_tokens=4) == llms["opt"].generate(long, max_new_tokens=4)
    err = capfd.readouterr().err
    assert err.count("--policy auto on t4-paper") == 2, err


def test_policy_auto_measures_the_machine_once_per_llm(llms, capfd, tmp_path):
    # Without --hardware the machine is measured (seconds); a second plan for a larger shape
    # reuses its rates and reads its memory again.
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", policy="auto", offload_dir=str(tmp_path))
    capfd.readouterr()
    short, long = [[2, 100]], [[2] + [100 + i for i in range(120)]] * 3
    assert llm.generate(short, max_new_tokens=2) == llms["opt"].generate(short, max_new_tokens=2)
    assert llm.generate(long, max_new_tokens=2) == llms["opt"].generate(long, max_new_tokens=2)
    err = capfd.readouterr().err
    assert err.count("--policy auto on measured") == 2, err
    assert err.count("measuring this machine") == 1, err
    assert err.count("this machine's rates as measured for an earlier plan, its memory as of now") == 1, err


def test_stop_strings_end_sequences_early(llms):
    # The text is cut before the first stop string, the tokens end with the one that completed
    # it, and a sequence whose text never holds one runs its full length.
    llm = llms["opt"]
    full = llm.generate(PROMPTS, max_new_tokens=20, ignore_eos=True)
    stop = [" LORD", "zzzq"]
    got = llm.generate(PROMPTS, max_new_tokens=20, ignore_eos=True, stop=stop)
    assert any(c.finish_reason == "stop" for c in got)
    for f, g in zip(full, got):
        cuts = [f.text.find(s) for s in stop if s in f.text]
        if not cuts:
            assert g == f
            continue
        assert g.finish_reason == "stop"
        assert g.text == f.text[:min(cuts)]
        n = len(g.token_ids)
        assert n < len(f.token_ids) and g.token_ids == f.token_ids[:n]
        assert not any(s in llm.decode(g.token_ids[:n - 1]) for s in stop)  # ended at the first token it could
        assert any(s in llm.decode(g.token_ids) for s in stop)
    assert llm.generate(PROMPTS[0], max_new_tokens=20, ignore_eos=True, stop=" LORD") == got[:1]
    # A stop string completed by the last token allowed is a stop (vLLM's order), not "length".
    for g in got:
        if g.finish_reason == "stop":
            p = PROMPTS[got.index(g)]
            assert llm.generate(p, max_new_tokens=len(g.token_ids), ignore_eos=True, stop=stop) == [g]
    with pytest.raises(flexh2o.Error, match="empty string"):
        llm.generate(PROMPTS[0], stop=[""])


def test_continuous_under_a_kv_policy_says_once_that_it_runs_static_batches(capfd):
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=1, kv_policy="h2o", heavy_ratio=0.2,
                      recent_ratio=0.2)
    capfd.readouterr()
    got = llm.generate(PROMPTS[:2], max_new_tokens=4, continuous=True)
    assert "continuous batching needs a full cache" in capfd.readouterr().err
    assert llm.last_report["continuous"] is False
    assert got == llm.generate(PROMPTS[:2], max_new_tokens=4)
    llm.generate(PROMPTS[:2], max_new_tokens=4, continuous=True)
    assert "continuous batching" not in capfd.readouterr().err  # once per LLM


def test_continuous_batching_gives_the_same_completions_in_fewer_steps():
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=3)
    prompts = [p + " " + w for p in PROMPTS for w in ("and", "unto", "the", "Then")]
    kw = dict(max_new_tokens=24, temperature=0.8, seed=5, stop=[" LORD", ","], logprobs=1)
    static = llm.generate(prompts, **kw)
    static_steps = llm.last_report["decode_steps"]
    got = llm.generate(prompts, continuous=True, **kw)
    assert got == static
    assert len({len(c.token_ids) for c in got}) > 3, "lengths must vary for this to check anything"
    r = llm.last_report
    assert r["continuous"] and r["refills"] > 0 and r["decode_steps"] < static_steps
