"""flexh2o.serve's limits on what clients send, and the flags it takes: a body nested too deeply
gets a 400 like other malformed JSON; a client that stalls while sending its request gets a 408
and its connection closed, while slow answers and streams are never cut; `generate`'s flags that
are request fields are refused, named as written; --ignore-eos applies to every request."""

import http.client
import json
import socket
import time

import pytest

import flexh2o
from conftest import TINY, run_module
from test_serve import FakeLLM, Running


def answer_ok(lines, **kw):
    return [json.dumps({"response": {"status_code": 200, "body": {"ok": True}}}) for _ in lines]


def raw_exchange(srv, data, timeout=10):
    """Sends `data` on a new connection and reads until the server closes it."""
    s = socket.create_connection((srv.host, srv.port), timeout=timeout)
    try:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    finally:
        s.close()


def nested(depth):
    """A completions body whose arrays/objects nest `depth` levels (the body itself is one)."""
    return '{"prompt": "a", "x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def test_a_body_nested_too_deeply_gets_a_400():
    srv = Running(FakeLLM(answer_ok))
    too_deep = (400, {"error": {"message": "the body nests arrays/objects more than 64 levels deep; refusing it",
                                "type": "invalid_request_error", "param": None, "code": None}})
    try:
        # 1000 levels: Python's parser raised RecursionError, which ended the handler thread.
        assert srv.request("POST", "/v1/completions", raw=nested(1000).encode()) == too_deep
        assert srv.request("POST", "/v1/completions", raw=nested(65).encode()) == too_deep
        assert srv.request("POST", "/v1/completions", raw=nested(64).encode()) == (200, {"ok": True})
    finally:
        srv.stop()


def test_a_client_that_stalls_mid_request_gets_408_and_is_closed():
    srv = Running(FakeLLM(answer_ok), read_timeout=0.3)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
    want = {"error": {"message": "the request was not received within 0.3 s", "type": "invalid_request_error",
                      "param": None, "code": None}}
    try:
        t0 = time.monotonic()
        for partial in (head + b"\r\n" + b'{"prompt": ', head):  # the body cut short; the headers
            status, _, body = raw_exchange(srv, partial).partition(b"\r\n")
            assert status == b"HTTP/1.1 408 Request Timeout", status
            assert json.loads(body.partition(b"\r\n\r\n")[2]) == want
        assert raw_exchange(srv, b"") == b""  # a connection that never sends is closed without a word
        assert time.monotonic() - t0 < 5
        assert srv.request("POST", "/v1/completions", {"prompt": "x"}) == (200, {"ok": True})
    finally:
        srv.stop()


def test_slow_answers_and_streams_are_not_cut_by_the_read_timeout():
    """The engine takes 3 x read_timeout to answer a plain request and pauses as long between
    a stream's chunks: only reading the request is timed. (A read timeout of a second: a request
    sent at once must not time out on a loaded machine.)"""
    def openai(lines, on_event=None, **kw):
        if json.loads(lines[0])["body"].get("stream"):
            for k in range(2):
                on_event(0, "chunk", json.dumps({"k": k}))
                time.sleep(3.0)
        else:
            time.sleep(3.0)
        on_event(0, "line", json.dumps({"response": {"status_code": 200, "body": {"ok": True}}}))
        return ["null"]

    srv = Running(FakeLLM(openai), read_timeout=1.0)
    try:
        assert srv.request("POST", "/v1/completions", {"prompt": "x"}) == (200, {"ok": True})
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=10)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "stream": True}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200 and r.read() == b'data: {"k": 0}\n\ndata: {"k": 1}\n\ndata: [DONE]\n\n'
        c.close()
    finally:
        srv.stop()


SAMPLING_FIELD = ("is a request field in serve, not a flag: each request sets \"{}\" (OpenAI's default when it does "
                  "not); serve's own sampling flags are --greedy, --top-k, --min-p, --repetition-penalty, "
                  "--ignore-eos and --seed")


@pytest.mark.parametrize("flag, field", [(["--temperature", "0.5"], "temperature"), (["--top-p=0.9"], "top_p"),
                                         (["--presence-penalty", "1"], "presence_penalty"),
                                         (["--frequency_penalty", "1"], "frequency_penalty"),
                                         (["--logprobs", "2"], "logprobs")])
def test_generates_sampling_flags_that_requests_carry_are_refused_as_written(flag, field):
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", *flag])
    assert r.returncode == 2
    assert r.stderr == f"flexh2o serve: {flag[0].partition('=')[0]} {SAMPLING_FIELD.format(field)}\n", r.stderr


def test_unknown_flags_are_named_as_written():
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", "--generation-config", "none"])
    assert r.returncode == 2 and r.stderr == (
        "flexh2o serve: --generation-config is not taken: request fields not given take OpenAI's defaults; the "
        "sampling values of the model's generation_config.json are not read (its eos_token_id is)\n"), r.stderr
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", "--no-such-flag", "1"])
    assert r.returncode == 2 and r.stderr.endswith(
        "flexh2o serve: unknown flag --no-such-flag (serve's flags: --help; engine flags: `flexh2o generate "
        "--help`)\n"), r.stderr


def test_ignore_eos_makes_every_request_generate_its_max_tokens():
    eos = {"model": "m", "prompt": "In the beginning", "max_tokens": 5, "temperature": 0, "logit_bias": {"2": 100}}
    got = {}
    for ignore in (False, True):
        srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), ignore_eos=ignore)
        try:
            status, body = srv.request("POST", "/v1/completions", eos)
        finally:
            srv.stop()
        assert status == 200, body
        got[ignore] = (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"])
    assert got == {False: (1, "stop"), True: (5, "length")}


@pytest.mark.parametrize("flags, says", [
    (["--port", "99999"], "--port must be in [0, 65535] (0: any free one), got 99999"),
    (["--port", "-1"], "--port must be in [0, 65535] (0: any free one), got -1"),
    (["-n", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--max-batch-requests", "0"], "--max-batch-requests must be at least 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--batch-wait-ms", "nan"], "--batch-wait-ms must be a finite number of milliseconds >= 0, got nan"),
    (["--read-timeout", "0"], "--read-timeout must be a finite number of seconds > 0, got 0"),
])
def test_serves_own_flags_out_of_range_are_a_wrong_command_line(flags, says):
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", *flags])
    assert r.returncode == 2 and r.stderr == f"flexh2o serve: {says}\n", r.stderr


def test_an_address_that_cannot_be_listened_on_is_refused_before_the_model_loads(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:  # the model does not exist: the address is what is said, so it was checked first
        r = run_module(["serve", "-m", str(tmp_path / "no-model"), "--port", str(port)])
    finally:
        taken.close()
    assert r.returncode == 1 and r.stderr == (
        f"flexh2o serve: cannot listen on 127.0.0.1:{port}: Address already in use\n"), r.stderr
    r = run_module(["serve", "-m", str(tmp_path / "no-model"), "--host", "no.such.host.invalid"])
    assert r.returncode == 1 and r.stderr.startswith("flexh2o serve: cannot listen on no.such.host.invalid:8000: "), \
        r.stderr
