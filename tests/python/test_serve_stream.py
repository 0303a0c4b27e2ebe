"""flexh2o.serve's streaming and early answers: streamed chunks add up to the plain answer
(completions, chat, several choices, stop strings, echo, in memory and offloaded), a request is
answered when its own choices end, a client that leaves ends its request, and failures before
and after the first chunk reach the client."""

import http.client
import io
import json
import socket
import threading
import time

import pytest

import flexh2o
from conftest import TINY
from test_serve import FakeLLM, Running, comparable


def stream(srv, path, body):
    """(status, headers, [parsed chunks], saw [DONE]) of a streamed request; a non-200 answer
    comes back as (status, headers, parsed JSON body, False)."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode("utf-8")
    c.close()
    if r.status != 200:
        return r.status, dict(r.getheaders()), json.loads(raw), False
    chunks, done = [], False
    for event in raw.split("\n\n"):
        if not event:
            continue
        assert event.startswith("data: ") and not done, event
        data = event[len("data: "):]
        if data == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(data))
    return r.status, dict(r.getheaders()), chunks, done


def assemble(chunks, chat):
    """Each choice's (text, finish_reason) from its chunks, and the usage chunk's usage."""
    out, usage = {}, None
    for ch in chunks:
        if not ch["choices"]:
            usage = ch["usage"]
        for c in ch["choices"]:
            text, fin = out.get(c["index"], ("", None))
            text += c["delta"].get("content", "") if chat else c["text"]
            out[c["index"]] = (text, c["finish_reason"] or fin)
    return out, usage


def assemble_logprobs(chunks, index):
    """A completions choice's logprobs from its chunks' (None when they carry none)."""
    out = None
    for ch in chunks:
        for c in ch["choices"]:
            if c["index"] != index or c["logprobs"] is None:
                continue
            out = out or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            for key in out:
                out[key] += c["logprobs"][key]
    return out


STREAMED = [
    {"model": "m", "prompt": "In the beginning God created", "max_tokens": 24, "temperature": 0},
    {"model": "m", "prompt": "And the LORD said", "max_tokens": 30, "temperature": 0, "stop": [" the LORD", "zz"],
     "logprobs": 2},
    {"model": "m", "prompt": "Blessed are", "max_tokens": 12, "temperature": 0.8, "seed": 11, "n": 3},
    {"model": "m", "prompt": "caf\u00e9 \u2603 \u65e5\u672c", "max_tokens": 16, "temperature": 1.0, "seed": 3,
     "stream_options": {"include_usage": True}, "logprobs": 0},
    # "echo": the prompt's chunk first, with its scored tokens (the first one's null).
    {"model": "m", "prompt": "And God said, Let there be", "max_tokens": 10, "temperature": 0, "echo": True,
     "logprobs": 1, "n": 2},
    {"model": "m", "prompt": "caf\u00e9 \u2603", "max_tokens": 6, "temperature": 0, "echo": True},
]


@pytest.mark.parametrize("flags", [{}, {"percent": [50, 50, 0, 100, 100, 0], "gpu_batch_size": 2}],
                         ids=["in_memory", "offloaded"])
def test_streamed_completions_add_up_to_the_plain_answers(flags):
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu", **flags))
    try:
        for body in STREAMED:
            plain = {k: v for k, v in body.items() if k != "stream_options"}
            status, want = srv.request("POST", "/v1/completions", plain)
            assert status == 200, want
            status, headers, chunks, done = stream(srv, "/v1/completions", {**body, "stream": True})
            assert status == 200 and done and headers["Content-Type"].startswith("text/event-stream"), chunks
            got, usage = assemble(chunks, chat=False)
            assert [got[c["index"]] for c in want["choices"]] == [(c["text"], c["finish_reason"])
                                                                  for c in want["choices"]], body
            # Log-probabilities stream with the tokens they belong to and add up to the answer's.
            assert [assemble_logprobs(chunks, c["index"]) for c in want["choices"]] == \
                [c["logprobs"] for c in want["choices"]], body
            assert len({ch["id"] for ch in chunks}) == 1 and chunks[0]["object"] == "text_completion"
            assert all(ch["model"] == "m" for ch in chunks)
            if "stream_options" in body:
                assert usage == want["usage"] and chunks[-1]["choices"] == []
                assert all(ch["usage"] is None for ch in chunks[:-1])
            else:
                assert usage is None and all("usage" not in ch for ch in chunks)
            # Text comes token by token: more chunks than choices (each choice's last has its finish).
            assert len(chunks) > len(want["choices"]) + (usage is not None)
    finally:
        srv.stop()
    # The stop string is never streamed, even in part.
    assert " the LORD" not in assemble(stream_once(STREAMED[1]), False)[0][0][0]


def stream_once(body):
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"))
    try:
        return stream(srv, "/v1/completions", {**body, "stream": True})[2]
    finally:
        srv.stop()


def test_streamed_chat_starts_with_the_role(chat_tokenizer):
    srv = Running(flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu"), max_new_tokens=16)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Who made the light?"}], "temperature": 0,
            "n": 2}
    try:
        status, want = srv.request("POST", "/v1/chat/completions", body)
        status2, _, chunks, done = stream(srv, "/v1/chat/completions", {**body, "stream": True})
    finally:
        srv.stop()
    assert status == status2 == 200 and done
    assert [ch["choices"][0]["delta"] for ch in chunks[:2]] == [{"role": "assistant", "content": ""}] * 2
    assert {ch["choices"][0]["index"] for ch in chunks[:2]} == {0, 1}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    got, _ = assemble(chunks, chat=True)
    assert [got[c["index"]] for c in want["choices"]] == [(c["message"]["content"], c["finish_reason"])
                                                          for c in want["choices"]]
    assert want["choices"][0]["message"]["content"], "an empty answer would check nothing"


def test_each_request_is_answered_when_its_own_choices_end():
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), batch_wait_ms=300)
    long = {"model": "m", "prompt": "In the beginning", "max_tokens": 250, "temperature": 0, "stream": True}
    short = {"model": "m", "prompt": "And God said", "max_tokens": 2, "temperature": 0}
    chunk_at, short_at, out = [], [], []

    def read_long():
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(long).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        while r.readline():  # one line at a time, as it arrives
            chunk_at.append(time.monotonic())
        c.close()

    def ask_short():
        out.append(srv.request("POST", "/v1/completions", short))
        short_at.append(time.monotonic())

    try:
        ts = [threading.Thread(target=read_long), threading.Thread(target=ask_short)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        srv.stop()
    assert srv.server.batches == 1, "both requests must share one engine call for this to check anything"
    assert out[0][0] == 200 and out[0][1]["usage"]["completion_tokens"] == 2
    later = sum(t > short_at[0] for t in chunk_at)
    assert later > len(chunk_at) // 2, (later, len(chunk_at))  # the long one went on after the short one's answer


def test_a_client_that_leaves_ends_its_request():
    log = io.StringIO()
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), max_new_tokens=1000, log=log)
    try:
        s = socket.create_connection((srv.host, srv.port), timeout=60)
        body = json.dumps({"model": "m", "prompt": "In the beginning", "max_tokens": 1000, "temperature": 0,
                           "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:  # streaming has started (the headers may come alone)
            more = s.recv(4096)
            assert more, got
            got += more
        s.close()
        status, _ = srv.request("POST", "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1})
        assert status == 200
    finally:
        srv.stop()
    # "flexh2o serve: 1 request(s), N tokens in ...": the first call ended long before 1000 tokens.
    calls = [line for line in log.getvalue().splitlines() if "request(s)" in line]
    assert len(calls) == 2, calls
    assert int(calls[0].split(", ")[1].split()[0]) < 500, calls


def test_a_client_that_leaves_before_its_plain_answer_ends_its_request():
    # As vLLM aborts it: not streamed, the server sees the connection close while it waits (the
    # call's log line counts it), and the engine ends the request before its 1000 tokens.
    log = io.StringIO()
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), max_new_tokens=1000, log=log, ignore_eos=True)
    try:
        s = socket.create_connection((srv.host, srv.port), timeout=60)
        body = json.dumps({"model": "m", "prompt": "In the beginning", "max_tokens": 1000,
                           "temperature": 0}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.close()
        status, answer = srv.request("POST", "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1})
        assert status == 200 and answer["usage"]["completion_tokens"] == 1
        # The second answer may come before the call that runs both ends: wait for its line.
        deadline = time.monotonic() + 30
        while "lost their client" not in log.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        srv.stop()
    calls = [line for line in log.getvalue().splitlines() if "request(s)" in line]
    assert sum("; 1 of them lost their client" in c for c in calls) == 1, calls
    assert all(int(c.split(", ")[1].split()[0]) < 1000 for c in calls), calls  # ended early


def test_a_streamed_request_that_cannot_run_gets_a_plain_error():
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"))
    try:
        status, headers, body, _ = stream(srv, "/v1/completions", {"model": "m", "prompt": "x", "stream": True,
                                                                   "temperature": 9})
        assert status == 400 and headers["Content-Type"] == "application/json"
        assert body["error"]["param"] == "temperature"
    finally:
        srv.stop()


def test_an_engine_failure_after_the_first_chunk_is_an_error_event():
    def openai(lines, on_event=None, **kw):
        on_event(0, "chunk", json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [
            {"index": 0, "text": "Hel", "logprobs": None, "finish_reason": None}]}))
        raise flexh2o.Error("device lost")

    srv = Running(FakeLLM(openai))
    try:
        status, _, chunks, done = stream(srv, "/v1/completions", {"model": "m", "prompt": "x", "stream": True})
    finally:
        srv.stop()
    assert status == 200 and done
    assert chunks[0]["choices"][0]["text"] == "Hel"
    assert chunks[1]["error"]["type"] == "server_error" and "device lost" in chunks[1]["error"]["message"]


def test_continuous_batching_in_the_server_keeps_every_answer():
    bodies = [{"model": "m", "prompt": f"In the beginning {w}", "max_tokens": 3 + 5 * (i % 4), "temperature": 0.8,
               "seed": i, "n": 1 + i % 2} for i, w in enumerate(["God", "was", "the", "and", "there", "light"])]
    answers = []
    for continuous in (False, True):
        llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=2)
        srv = Running(llm, batch_wait_ms=300, continuous=continuous)
        try:
            answers.append(srv.post_all("/v1/completions", bodies))
        finally:
            srv.stop()
        assert srv.server.batches == 1
        report = json.loads(llm._s.last_report())
        assert report["continuous"] == continuous and (report["refills"] > 0) == continuous
    for (s0, a0), (s1, a1) in zip(*answers):
        assert s0 == s1 == 200 and comparable(a0) == comparable(a1)


def test_with_continuous_a_request_joins_the_running_call():
    # The call starts with a long streamed request and a 5-token one; the short request sent
    # after the long one's first chunk takes the slot the 5-token one frees.
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", batch_size=4)
    log = io.StringIO()
    srv = Running(llm, continuous=True, max_prompt_len=8, max_new_tokens=400, batch_wait_ms=300, log=log)
    long = {"model": "m", "prompt": "In the beginning", "max_tokens": 400, "temperature": 0, "stream": True}
    brief = {"model": "m", "prompt": "Grace be", "max_tokens": 5, "temperature": 0}
    short = {"model": "m", "prompt": "And God said", "max_tokens": 3, "temperature": 0}
    too_long = {"model": "m", "prompt": "And the earth was without form, and void; and darkness was upon the face",
                "max_tokens": 3, "temperature": 0}
    echoed = {"model": "m", "prompt": "And God", "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    chunk_at, answers, started = [], {}, threading.Event()

    def read_long():
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        c.request("POST", "/v1/completions", body=json.dumps(long).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        while r.readline():
            chunk_at.append(time.monotonic())
            started.set()
        c.close()

    def ask(name, body):
        answers[name] = (srv.request("POST", "/v1/completions", body), time.monotonic())

    try:
        first = [threading.Thread(target=read_long), threading.Thread(target=ask, args=("brief", brief))]
        for t in first:
            t.start()
        assert started.wait(30)
        asks = [threading.Thread(target=ask, args=("short", short)),
                threading.Thread(target=ask, args=("too_long", too_long)),
                threading.Thread(target=ask, args=("echoed", echoed))]
        for a in asks:
            a.start()
        for a in asks + first:
            a.join()
        alone = srv.request("POST", "/v1/completions", short)
    finally:
        srv.stop()
    (status, body), at = answers["short"]
    assert status == 200 and comparable(body) == comparable(alone[1])
    assert sum(c > at for c in chunk_at) > 50, "the short request waited for the long one"
    # The prompt longer than --max-prompt-len did not fit the running batch: it ran once that
    # call had ended (`alone` may join its call).
    (status, body), at = answers["too_long"]
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    # A prompt to score (echo with logprobs) is scored before a call generates: the next call.
    (status, body), at = answers["echoed"]
    assert status == 200 and body["choices"][0]["logprobs"]["token_logprobs"][0] is None, body
    assert not any(c > at for c in chunk_at), "the echoed request joined the running call"
    calls = [line for line in log.getvalue().splitlines() if "request(s)" in line]
    assert calls[0].startswith("flexh2o serve: 3 request(s)") and len(calls) >= 2, calls
