"""Ctrl-C inside LLM.generate and the scoring calls: KeyboardInterrupt arrives within a step (not when the
whole call would have ended), and the LLM is usable afterwards. Run in a child interpreter so
that the signal cannot reach pytest."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TINY

CHILD = r"""
import json, os, signal, sys, threading, time
import flexh2o
llm = flexh2o.LLM(sys.argv[1], device="cpu")
work = dict(max_new_tokens=256, ignore_eos=True)
prompts = [[1, 100 + i] for i in range(48)]
t0 = time.perf_counter(); llm.generate(prompts, **work); full = time.perf_counter() - t0
sent = {}
def interrupt():
    sent["at"] = time.perf_counter()
    os.kill(os.getpid(), signal.SIGINT)
threading.Timer(0.1 * full, interrupt).start()
t0 = time.perf_counter()
try:
    llm.generate(prompts, **work)
    raised = False
except KeyboardInterrupt:
    raised = True
after = time.perf_counter() - sent["at"]
again = llm.generate([[1, 5]], max_new_tokens=4)
print(json.dumps({"full": full, "raised": raised, "after_signal": after, "again": len(again[0].token_ids)}))
"""


def test_ctrl_c_interrupts_generate():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", CHILD, str(TINY["llama"])], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["raised"], got
    # The uninterrupted call takes `full`; the interrupted one ends within the step under way.
    assert got["after_signal"] < 0.5 * got["full"], got
    assert got["again"] == 4


SCORING_CHILD = r"""
import json, os, signal, sys, threading, time
import flexh2o
llm = flexh2o.LLM(sys.argv[1], device="cpu", batch_size=4)
method = sys.argv[2]
seqs = [[1] + [100 + (i * 7 + t) % 500 for t in range(120)] for i in range(48)]
call = {"loglikelihood": lambda: llm.loglikelihood([(s[:60], s[60:]) for s in seqs]),
        "loglikelihood_rolling": lambda: llm.loglikelihood_rolling(seqs),
        "score": lambda: llm.score(seqs)}[method]
t0 = time.perf_counter(); want = call(); full = time.perf_counter() - t0
sent = {}
def interrupt():
    sent["at"] = time.perf_counter()
    os.kill(os.getpid(), signal.SIGINT)
threading.Timer(0.1 * full, interrupt).start()
try:
    call()
    raised = False
except KeyboardInterrupt:
    raised = True
after = time.perf_counter() - sent["at"]
print(json.dumps({"full": full, "raised": raised, "after_signal": after, "again": call() == want}))
"""


@pytest.mark.parametrize("method", ["loglikelihood", "loglikelihood_rolling", "score"])
def test_ctrl_c_interrupts_scoring(method):
    # The scoring calls end within their step under way too, not when the whole call would have ended.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", SCORING_CHILD, str(TINY["llama"]), method], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["raised"], got
    assert got["after_signal"] < 0.5 * got["full"] + 0.1, got  # + the signal's 50 ms poll
    assert got["again"], got
