"""flexh2o.serve, the OpenAI-compatible server: its answers equal what `generate` writes for the
same bodies in an OpenAI Batch file (completions, chat, offloaded), concurrent requests share
engine calls, and every bad request gets OpenAI's error shape with the right status. Streaming
is tested in test_serve_stream.py."""

import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import flexh2o
from flexh2o.serve import Server, _engine_flags
from conftest import TINY, cli_generate, run_module


class Running:
    """A Server on a free port, served by a thread, closed by stop()."""

    def __init__(self, llm, **kw):
        kw.setdefault("log", open("/dev/null", "w"))
        self.server = Server(llm, "127.0.0.1", 0, **kw)
        self.host, self.port = self.server.address
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, parsed JSON answer)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        out = (r.status, json.loads(r.read()))
        c.close()
        return out

    def post_all(self, path, bodies):
        """POSTs every body at once from its own thread: the answers, in order."""
        out = [None] * len(bodies)

        def one(i):
            out[i] = self.request("POST", path, bodies[i])

        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return out

    def stop(self):
        self.server.close()
        self.thread.join()


def comparable(body):
    """A response body without what differs between runs (ids, timestamps)."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


COMPLETIONS = [
    {"model": "m", "prompt": "In the beginning God created", "max_tokens": 8, "temperature": 0},
    {"model": "m", "prompt": "And the LORD said", "max_tokens": 12, "temperature": 0, "stop": [" said,"]},
    {"model": "m", "prompt": [[2, 133, 1139, 9], "Then"], "max_tokens": 5, "temperature": 0},
    {"model": "m", "prompt": "Blessed are", "max_tokens": 7, "temperature": 0.8, "top_p": 0.9, "seed": 11, "n": 2},
    {"model": "m", "prompt": "Let there be", "max_tokens": 4, "temperature": 0, "logprobs": 2},
    {"model": "m", "prompt": "Unto thee", "max_tokens": 6, "temperature": 0.7, "seed": 5, "presence_penalty": 1.5},
]


def batch_lines(url, bodies):
    return [{"custom_id": f"c{i}", "method": "POST", "url": url, "body": b} for i, b in enumerate(bodies)]


@pytest.mark.parametrize("flags", [{}, {"percent": [50, 50, 0, 100, 100, 0], "gpu_batch_size": 2}],
                         ids=["in_memory", "offloaded"])
def test_completions_equal_the_batch_files(tmp_path, flags):
    llm = flexh2o.LLM(str(TINY["opt"]), device="cpu", **flags)
    srv = Running(llm, batch_wait_ms=300)
    try:
        got = srv.post_all("/v1/completions", COMPLETIONS)
    finally:
        srv.stop()
    cli_flags = []
    for k, v in flags.items():
        cli_flags += ["--" + k.replace("_", "-")] + [str(x) for x in (v if isinstance(v, list) else [v])]
    want = cli_generate(tmp_path, TINY["opt"], batch_lines("/v1/completions", COMPLETIONS), *cli_flags)
    for i, ((status, body), line) in enumerate(zip(got, want)):
        assert status == 200 == line["response"]["status_code"], (i, body)
        assert comparable(body) == comparable(line["response"]["body"]), i
    assert got[1][1]["choices"][0]["finish_reason"] == "stop"
    assert len(got[3][1]["choices"]) == 2
    # Requests that arrive together share engine calls.
    assert srv.server.requests == len(COMPLETIONS) and srv.server.batches < len(COMPLETIONS)


def test_chat_equals_the_python_front_ends_batch_file(tmp_path, chat_tokenizer):
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")
    bodies = [{"model": "tiny", "messages": [{"role": "user", "content": "Who made the light?"}], "max_tokens": 6,
               "temperature": 0},
              {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}], "temperature": 0, "logprobs": True,
               "top_logprobs": 1},
              # vLLM's extra parameters: a continued assistant message, template variables, top_k.
              {"model": "tiny", "messages": [{"role": "user", "content": "Hello"},
                                             {"role": "assistant", "content": "In the beginning"}],
               "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 4,
               "chat_template_kwargs": {"enable_thinking": False}, "top_k": 3, "min_p": 0.1, "seed": 11}]
    # Content as a list of text parts (what many clients send) is the parts' text joined by newlines.
    parts = {**bodies[0], "messages": [{"role": "user", "content": [{"type": "text", "text": "Who made"},
                                                                     {"type": "text", "text": "the light?"}]}]}
    joined = {**bodies[0], "messages": [{"role": "user", "content": "Who made\nthe light?"}]}
    srv = Running(llm, max_new_tokens=9)
    try:
        got = srv.post_all("/v1/chat/completions", bodies)
        (p_status, p_body), (j_status, j_body) = srv.post_all("/v1/chat/completions", [parts, joined])
    finally:
        srv.stop()
    assert p_status == j_status == 200, p_body
    assert p_body["choices"][0]["message"] == j_body["choices"][0]["message"]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in batch_lines("/v1/chat/completions", bodies)))
    r = run_module(["generate", "-m", TINY["llama"], "--tokenizer", chat_tokenizer, "--input", inp, "--output", out,
                    "--quiet", "--device", "cpu", "--progress", "never"])
    assert r.returncode == 0, r.stderr
    want = [json.loads(l)["response"]["body"] for l in out.read_text().splitlines()]
    assert got[0][0] == 200 and comparable(got[0][1]) == comparable(want[0])
    # Without max_tokens a chat request gets up to the server's --max-new-tokens, not the context.
    assert got[1][0] == 200 and got[1][1]["usage"]["completion_tokens"] <= 9
    assert got[1][1]["choices"][0]["logprobs"]["content"]
    assert got[2][0] == 200 and comparable(got[2][1]) == comparable(want[2])
    continued = llm.encode("<s>\n[INST] Hello [/INST]\n In the beginning", add_special=False)
    assert got[2][1]["usage"]["prompt_tokens"] == len(continued)


@pytest.fixture(scope="module")
def opt_server():
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), max_new_tokens=20, api_key="sesame",
                  served_model_name="tiny-served")
    yield srv
    srv.stop()


AUTH = {"Authorization": "Bearer sesame"}


def test_the_servers_engine_calls_take_the_llms_call_lock(opt_server):
    # A thread calling the LLM directly holds its call lock over its call and the reading of its
    # report: a request (one token, milliseconds) is answered only after that thread lets go.
    llm = opt_server.server.llm
    out = {}

    def ask():
        out["r"] = opt_server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}, headers=AUTH)
        out["at"] = time.monotonic()

    with llm._call_lock:
        t = threading.Thread(target=ask)
        t.start()
        time.sleep(2.0)
        released = time.monotonic()
    t.join(timeout=60)
    assert out["r"][0] == 200, out
    assert out["at"] > released


def test_models_and_health(opt_server):
    assert opt_server.request("GET", "/health") == (200, {"status": "ok"})
    status, body = opt_server.request("GET", "/v1/models", headers=AUTH)
    assert status == 200 and [m["id"] for m in body["data"]] == ["tiny-served"]
    assert body["data"][0]["max_model_len"] == opt_server.server.llm.max_length == 1024
    # The client's models.retrieve(id): the card of the served model; another id is 404, as OpenAI.
    assert opt_server.request("GET", "/v1/models/tiny-served", headers=AUTH) == (200, body["data"][0])
    status, answer = opt_server.request("GET", "/v1/models/gpt-4o", headers=AUTH)
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer
    # An answer to a request without "model" names the served model, as /v1/models lists it.
    status, body = opt_server.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}, headers=AUTH)
    assert status == 200 and body["model"] == "tiny-served", body


@pytest.mark.parametrize("body, param, words", [
    ({"model": "m", "prompt": "x", "echo": "yes"}, "echo", "must be a boolean"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream", "must be a boolean"),
    ({"model": "m", "prompt": "x", "max_tokens": 21}, "max_tokens", "more than this server's limit of 20"),
    ({"model": "m", "prompt": [[2, 99999]], "max_tokens": 1}, "prompt", "prompt"),
    ({"model": "m", "prompt": "x", "max_tokens": 1, "logit_bias": {"99999": 5}}, "logit_bias", "99999"),
    ({"model": "m", "prompt": "x", "best_of": 3}, "best_of", "best_of"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "messages", "no chat template"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "messages", "is not one of system"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages", "flexh2o serves text models"),
    ({"model": "m", "prompt": "x", "temperature": "hot"}, "temperature", "temperature"),
    # Not "in [-9223372036854775808, 9223372036854775807]": any integer is a seed.
    ({"model": "m", "prompt": "x", "seed": "7"}, "seed", '"seed" must be an integer, got "7".'),
])
def test_bad_bodies_get_openai_errors(opt_server, body, param, words):
    url = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, answer = opt_server.request("POST", url, body, headers=AUTH)
    assert status == 400, answer
    err = answer["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"], err
    assert err["code"] is None, err
    assert "Traceback" not in err["message"] and "At:" not in err["message"]


def test_the_log_counts_refused_requests():
    log = io.StringIO()
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"), max_new_tokens=4, log=log)
    try:
        assert srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 9})[0] == 400
        assert srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
    finally:
        srv.stop()
    lines = [l for l in log.getvalue().splitlines() if "request(s)" in l]
    assert len(lines) == 2 and "; 1 refused" in lines[0] and "refused" not in lines[1], lines


def test_a_prompt_past_the_context_is_context_length_exceeded(opt_server):
    # OpenAI's code, which clients (LangChain's ContextOverflowError) act on: the prompt alone
    # (param: the prompt), or the prompt and max_tokens (param: max_tokens).
    n = opt_server.server.llm.max_length
    for body, param in (({"prompt": [[2] * (n + 1)], "max_tokens": 1}, "prompt"),
                        ({"prompt": [[2] * (n - 4)], "max_tokens": 10}, "max_tokens")):
        status, answer = opt_server.request("POST", "/v1/completions", {"model": "m", **body}, headers=AUTH)
        assert status == 400, answer
        assert answer["error"]["code"] == "context_length_exceeded" and answer["error"]["param"] == param, answer


def test_bad_requests_get_their_status(opt_server):
    assert opt_server.request("POST", "/v1/completions", {"prompt": "x"})[0] == 401  # no key
    assert opt_server.request("POST", "/v1/completions", {"prompt": "x"}, {"Authorization": "Bearer no"})[0] == 401
    assert opt_server.request("GET", "/v1/models")[0] == 401
    status, answer = opt_server.request("POST", "/v1/completions", headers=AUTH, raw=b"{not json")
    assert status == 400 and "not JSON" in answer["error"]["message"]
    assert opt_server.request("POST", "/v1/completions", [1, 2], headers=AUTH)[0] == 400
    status, answer = opt_server.request("POST", "/v1/embeddings", {"input": "x"}, headers=AUTH)
    assert status == 404 and "/v1/completions" in answer["error"]["message"]
    assert opt_server.request("GET", "/v2/anything")[0] == 404
    for method in ("DELETE", "PUT", "OPTIONS"):  # OpenAI's error shape, not an HTML page
        status, answer = opt_server.request(method, "/v1/completions", headers=AUTH)
        assert status == 405 and "is not served" in answer["error"]["message"], (method, answer)
    # A body over the limit is refused from its header, before it is read.
    c = http.client.HTTPConnection(opt_server.host, opt_server.port, timeout=30)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Authorization", "Bearer sesame")
    c.putheader("Content-Length", str(65 << 20))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 413 and "more than" in json.loads(r.read())["error"]["message"]
    c.close()
    # ... and one without Content-Length.
    c = http.client.HTTPConnection(opt_server.host, opt_server.port, timeout=30)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Authorization", "Bearer sesame")
    c.endheaders()
    r = c.getresponse()
    assert r.status == 411
    c.close()
    # A Content-Length that is not a number is a bad request.
    c = http.client.HTTPConnection(opt_server.host, opt_server.port, timeout=30)
    c.putrequest("POST", "/v1/completions")
    c.putheader("Authorization", "Bearer sesame")
    c.putheader("Content-Length", "-5")
    c.endheaders()
    r = c.getresponse()
    assert r.status == 400 and "Content-Length" in json.loads(r.read())["error"]["message"]
    c.close()
    # Transfer-Encoding beside Content-Length (a smuggling pattern) is refused; a coding other
    # than chunked is not served.
    for headers, want in (({"Transfer-Encoding": "chunked", "Content-Length": "5"}, 400),
                          ({"Transfer-Encoding": "gzip, chunked"}, 501)):
        c = http.client.HTTPConnection(opt_server.host, opt_server.port, timeout=30)
        c.putrequest("POST", "/v1/completions")
        c.putheader("Authorization", "Bearer sesame")
        for k, v in headers.items():
            c.putheader(k, v)
        c.endheaders()
        r = c.getresponse()
        assert r.status == want and "Transfer-Encoding" in json.loads(r.read())["error"]["message"], headers
        c.close()
    # A chunked body (what clients send for a body of unknown length) is read as HTTP/1.1 says;
    # a malformed one is a 400.
    body = json.dumps({"model": "m", "prompt": "In", "max_tokens": 2}).encode()
    for chunks, want in (([body[:7], body[7:]], 200), ([b"zz"], 400)):
        c = http.client.HTTPConnection(opt_server.host, opt_server.port, timeout=30)
        if want == 200:
            c.request("POST", "/v1/completions", body=iter(chunks), encode_chunked=True,
                      headers={**AUTH, "Transfer-Encoding": "chunked"})
        else:
            c.putrequest("POST", "/v1/completions")
            c.putheader("Authorization", "Bearer sesame")
            c.putheader("Transfer-Encoding", "chunked")
            c.endheaders(b"zz\r\nab\r\n0\r\n\r\n")
        r = c.getresponse()
        answer = json.loads(r.read())
        assert r.status == want, answer
        if want == 200:
            assert answer["usage"]["completion_tokens"] == 2
        c.close()
    # The server still answers.
    status, answer = opt_server.request("POST", "/v1/completions", {"model": "m", "prompt": "In", "max_tokens": 2},
                                        headers=AUTH)
    assert status == 200 and answer["model"] == "m" and answer["usage"]["completion_tokens"] == 2


def test_a_closed_server_refuses_and_waiting_requests_are_answered():
    srv = Running(flexh2o.LLM(str(TINY["opt"]), device="cpu"))
    srv.stop()
    p = srv.server.submit("/v1/completions", {"model": "m", "prompt": "x"})
    assert p.done.is_set() and p.status == 503 and "shutting down" in p.body["error"]["message"]
    with pytest.raises((ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/health", timeout=5)


def test_engine_flags_and_unknown_ones():
    assert _engine_flags(["--percent", "20", "80", "0", "100", "0", "100", "--cpu-cache-compute",
                          "--kv-policy=h2o", "--heavy-ratio", "0.1"]) == {
        "percent": ["20", "80", "0", "100", "0", "100"], "cpu_cache_compute": True, "kv_policy": "h2o",
        "heavy_ratio": "0.1"}
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", "--no-such-flag", "1"])
    assert r.returncode == 2 and "unknown flag --no-such-flag" in r.stderr, r.stderr
    # A sampling default that no request could run with is serve's error, before the model loads.
    # The messages are generate's for the same flags.
    for flag, value, words in (("--top-k", "-2", "top_k must be a count of tokens, or 0 or -1 (off), got -2 (--top-k)"),
                               ("--min-p", "7", "min_p must be in [0, 1], got 7 (--min-p)"),
                               ("--repetition-penalty", "0", "repetition_penalty must be > 0 (1 = off), got 0 "
                                                             "(--repetition-penalty)"),
                               ("--top-k", "3000000000", "top_k must be at most 2147483647, got 3000000000")):
        r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", flag, value])
        assert r.returncode == 2 and words in r.stderr and "on http://" not in r.stderr, r.stderr
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", "--kv-policy", "bogus"])
    assert r.returncode == 1 and "bogus" in r.stderr, r.stderr
    # The weights are placed before the server listens: a budget too small ends it at once.
    r = run_module(["serve", "-m", TINY["opt"], "--device", "cpu", "--port", "0", "--percent", "100", "0", "100",
                    "0", "100", "0", "--gpu-mem", "64KiB"], timeout=120)
    assert r.returncode == 1 and "budget" in r.stderr and "on http://" not in r.stderr, r.stderr


def test_the_command_serves_until_sigint():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-m", "flexh2o", "serve", "-m", str(TINY["opt"]), "--device", "cpu",
                          "--port", "0", "--greedy", "--ignore-eos", "--read-timeout", "5"], stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        line = ""
        for _ in range(50):  # the model's load notes may come first
            line = p.stderr.readline()
            if "on http://" in line or not line:
                break
        assert "on http://127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "m", "prompt": "In the beginning", "max_tokens": 3,
                                                      "temperature": 1.5}).encode())
        body = json.loads(urllib.request.urlopen(req, timeout=60).read())
        assert body["usage"]["completion_tokens"] == 3
        (want,) = flexh2o.LLM(str(TINY["opt"]), device="cpu").generate(["In the beginning"], max_new_tokens=3)
        assert body["choices"][0]["text"] == want.text  # --greedy wins over the body's temperature
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "stopping" in err, err
    finally:
        p.kill()


def test_a_signal_answers_the_requests_in_flight_before_the_process_ends():
    """SIGTERM while a call runs: the streamed request gets its error event and [DONE], the
    waiting plain one its whole 503 (the handler threads write before the process exits)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-m", "flexh2o", "serve", "-m", str(TINY["opt"]), "--device", "cpu",
                          "--port", "0", "--max-new-tokens", "1000"], stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        line = ""
        for _ in range(50):
            line = p.stderr.readline()
            if "on http://" in line or not line:
                break
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        # 16 x 1000 tokens, EOS banned: about 2 s on 2 cores, so the signal comes while it runs.
        long = {"model": "m", "prompt": "In the beginning", "max_tokens": 1000, "n": 16, "logit_bias": {"2": -100}}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({**long, "stream": True}),
                     headers={"Content-Type": "application/json"})
        streamed = conn.getresponse()
        assert streamed.status == 200 and streamed.readline().startswith(b"data: ")  # the call runs
        plain = {}

        def post():
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/v1/completions", body=json.dumps(long),
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                plain["answer"] = (r.status, json.loads(r.read()))
            except Exception as e:  # noqa: BLE001 - what the client saw
                plain["answer"] = e

        t = threading.Thread(target=post)
        t.start()
        time.sleep(0.3)  # the plain request is queued behind the running call
        p.send_signal(signal.SIGTERM)
        rest = streamed.read().decode()
        t.join(60)
        assert rest.rstrip().endswith("data: [DONE]") and "shutting down" in rest, rest[-300:]
        status, body = plain["answer"]
        assert status == 503 and "shutting down" in body["error"]["message"], body
        p.communicate(timeout=60)
        assert p.returncode == 0
    finally:
        p.kill()


class FakeLLM:
    """Stands in for flexh2o.LLM where the engine must fail or block: `openai` is the behaviour."""

    def __init__(self, openai):
        self.name = "fake"
        self._s = self
        self.openai = openai
        self._call_lock = threading.Lock()

    def prepare(self, *args):
        pass


def test_an_engine_failure_answers_500_and_the_server_goes_on():
    calls = []

    def openai(lines, **kw):
        calls.append(len(lines))
        if len(calls) == 1:
            raise flexh2o.Error("device budget 1 KiB is too small")
        return [json.dumps({"response": {"status_code": 200, "body": {"usage": {"completion_tokens": 1}, "ok": True}}})
                for _ in lines]

    srv = Running(FakeLLM(openai))
    try:
        status, body = srv.request("POST", "/v1/completions", {"model": "m", "prompt": "x"})
        assert status == 500 and body["error"]["type"] == "server_error"
        assert "budget 1 KiB is too small" in body["error"]["message"]
        assert srv.request("POST", "/v1/completions", {"model": "m", "prompt": "x"}) == (
            200, {"usage": {"completion_tokens": 1}, "ok": True})
    finally:
        srv.stop()


def test_closing_ends_the_running_call_and_answers_503():
    started = threading.Event()

    def openai(lines, stop=None, **kw):
        started.set()
        while not stop.is_set():  # the engine's token steps, until the server stops it
            threading.Event().wait(0.01)
        raise flexh2o.Error("interrupted")

    srv = Running(FakeLLM(openai))
    out = {}
    t = threading.Thread(target=lambda: out.update(r=srv.request("POST", "/v1/completions", {"prompt": "x"})))
    t.start()
    assert started.wait(30)
    srv.stop()
    t.join(30)
    status, body = out["r"]
    assert status == 503 and "shutting down" in body["error"]["message"]
