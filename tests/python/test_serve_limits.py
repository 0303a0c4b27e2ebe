"""flexh2o.serve's limits on what clients send: a body nested too deeply gets a 400 like other
malformed JSON."""

import json

from test_serve import FakeLLM, Running


def answer_ok(lines, **kw):
    return [json.dumps({"response": {"status_code": 200, "body": {"ok": True}}}) for _ in lines]


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
