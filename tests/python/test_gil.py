"""The engine runs with the GIL released: a Python thread keeps counting while generate and
the scoring calls run, and two threads may share one LLM (calls take turns)."""

import ctypes
import threading
import time

import flexh2o
from conftest import TINY


def longest_pause(fn):
    """Runs fn() while a Python thread ticks; returns (the longest gap between two ticks
    during the call, the call's duration) in seconds. A call holding the GIL stops the ticks
    for its whole duration."""
    stop = threading.Event()
    ticks = {"last": None, "gap": 0.0, "on": False}

    def tick():
        while not stop.is_set():
            now = time.perf_counter()
            if ticks["on"] and ticks["last"] is not None:
                ticks["gap"] = max(ticks["gap"], now - ticks["last"])
            ticks["last"] = now

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.05)  # the thread is ticking
    ticks["on"] = True
    t0 = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t0
    time.sleep(0.01)  # a tick after the call closes the last gap
    stop.set()
    t.join()
    return ticks["gap"], elapsed


def test_the_measure_sees_a_held_gil():
    libc = ctypes.PyDLL(None)  # PyDLL calls keep the GIL
    gap, elapsed = longest_pause(lambda: libc.usleep(300000))
    assert gap > 0.9 * elapsed, (gap, elapsed)


def for_at_least(seconds, fn):
    """Calls fn() until `seconds` have passed, so the measure does not depend on how fast
    this machine is (one call may take less than a scheduler tick)."""
    def run():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
    return run


def test_generate_releases_the_gil(llms):
    llm = llms["llama"]
    call = lambda: llm.generate(["In the beginning"] * 8, max_new_tokens=128, ignore_eos=True)
    t0 = time.perf_counter()
    call()
    one = time.perf_counter() - t0
    gap, elapsed = longest_pause(for_at_least(0.5, call))
    assert elapsed >= 0.5
    # A call that held the GIL would stop the ticks for a whole call, at least `one` long.
    assert gap < 0.75 * one, (gap, one, elapsed)


def test_scoring_releases_the_gil(llms):
    llm = llms["llama"]
    ids = list(range(4, 400))
    gap, elapsed = longest_pause(lambda: llm.loglikelihood_rolling([ids, ids]))
    assert gap < 0.5 * elapsed, (gap, elapsed)
    ctx = list(range(4, 200))
    gap, elapsed = longest_pause(lambda: llm.loglikelihood([(ctx, list(range(200, 260)))] * 8))
    assert gap < 0.5 * elapsed, (gap, elapsed)


def test_threads_share_one_llm():
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu")
    want = llm.generate(["Grace be unto you"], max_new_tokens=8)
    results = [None] * 4

    def work(i):
        results[i] = llm.generate(["Grace be unto you"], max_new_tokens=8)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 4


def test_each_thread_reads_its_own_last_report():
    # Threads calling one LLM in turn: each thread's last_report is its own call's.
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu")
    wrong = []

    def generating():
        for _ in range(15):
            llm.generate(["Grace be unto you"] * 3, max_new_tokens=4)
            if llm.last_report.get("requests") != 3:
                wrong.append(("generate", llm.last_report))

    def scoring():
        for _ in range(15):
            llm.loglikelihood_rolling([[2, 5, 6, 7]] * 5)
            if llm.last_report.get("scored_tokens") != 15:
                wrong.append(("rolling", llm.last_report))

    def guarded(f):
        def run():
            try:
                f()
            except Exception as e:  # a thread's failure fails the test, not only a warning
                wrong.append(("raised", repr(e)))
        return run

    threads = [threading.Thread(target=guarded(f)) for f in (generating, scoring, generating, scoring)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:2]
