"""The HTTP side of `python -m flexh2o serve`: the request handler (reading requests with their
limits, authorization, routing, plain answers and server-sent event streams, noticing clients that
leave), OpenAI's error body and the limits a request must keep. The engine side is serve.Server,
whose submit()/_handled() the handler calls."""

import json
import queue
import re
import socket
import urllib.parse
from http.server import BaseHTTPRequestHandler

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_BODY = 64 << 20  # bytes; the CLI's JSONL line limit
MAX_DEPTH = 64  # array/object nesting a body may have; the CLI's JSONL lines' (core/input_guard.h)
READ_TIMEOUT = 60.0  # seconds a client may take to send a request (headers and body)
CLIENT_POLL_S = 0.05  # how often a handler waiting for a plain answer looks whether its client left


def error_body(message, type_="invalid_request_error", param=None, code=None):
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _too_deep(value, limit=MAX_DEPTH):
    """Whether parsed JSON nests arrays/objects deeper than `limit`. Iterative: the recursion a
    deep value costs is what this guards (json.dumps and the engine's walks of it)."""
    pending = [(value, 1)]
    while pending:
        v, depth = pending.pop()
        if depth > limit:
            return True
        pending.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list)))
    return False


def _handler_for(server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "flexh2o"

        def handle_one_request(self):
            # Only reading a request may time out: a client that stalls mid-request must not hold
            # its thread forever. do_POST lifts the limit once the body is in, so waiting for the
            # engine and writing a long answer or stream are never cut; it is set again for the
            # next request on the connection (an idle keep-alive connection is closed after it).
            self.connection.settimeout(server.read_timeout)
            super().handle_one_request()

        def parse_request(self):
            try:
                return super().parse_request()
            except TimeoutError:  # the request line came, its headers did not
                self._timed_out()
                return False

        def _timed_out(self):
            self.close_connection = True
            self._send(408, error_body(f"the request was not received within {server.read_timeout:g} s"))

        def log_message(self, fmt, *args):
            if server.log_requests:
                print(f"flexh2o serve: {self.address_string()} {fmt % args}", file=server.log, flush=True)

        def _send(self, status, body):
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client left; its answer is dropped
                self.close_connection = True

        def _authorized(self):
            if server.api_key is None:
                return True
            if self.headers.get("Authorization", "") == f"Bearer {server.api_key}":
                return True
            self._send(401, error_body("missing or wrong API key (Authorization: Bearer KEY)"))
            return False

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/v1/models":
                if self._authorized():
                    self._send(200, {"object": "list", "data": [server.model_card()]})
            elif path.startswith("/v1/models/"):  # the client's models.retrieve(id)
                if self._authorized():
                    name = urllib.parse.unquote(path[len("/v1/models/"):])
                    if name == server.model_name:
                        self._send(200, server.model_card())
                    else:
                        self._send(404, error_body(f"The model '{name}' does not exist (this server serves "
                                                   f"'{server.model_name}')", param="model", code="model_not_found"))
            else:
                self._send(404, error_body(f"no such endpoint: GET {path}"))

        def _not_allowed(self):
            self.close_connection = True  # a body, if any, is not read
            self._send(405, error_body(f"method {self.command} is not served (GET /health, /v1/models; POST "
                                       f"{', '.join(ENDPOINTS)})"))

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            length = self.headers.get("Content-Length")
            if path not in ENDPOINTS:
                self.close_connection = True  # the body is not read
                self._send(404, error_body(f"no such endpoint: POST {path} (flexh2o serves "
                                           f"{', '.join(ENDPOINTS)})"))
                return
            if not self._authorized():
                self.close_connection = True
                return
            coding = self.headers.get("Transfer-Encoding")
            chunked = coding is not None
            if chunked and coding.strip().lower() != "chunked":
                self.close_connection = True
                self._send(501, error_body(f"Transfer-Encoding {coding[:40]!r} is not served (only chunked)"))
                return
            if chunked and length is not None:  # RFC 9112 6.1: a request smuggling pattern
                self.close_connection = True
                self._send(400, error_body("a request has both Transfer-Encoding and Content-Length"))
                return
            if length is None and not chunked:
                self.close_connection = True
                self._send(411, error_body("a request needs a Content-Length header or a chunked body"))
                return
            if length is not None and not re.fullmatch(r"[0-9]{1,20}", length.strip()):
                self.close_connection = True
                self._send(400, error_body(f"Content-Length must be a number of bytes, got {length[:40]!r}"))
                return
            if length is not None and int(length) > MAX_BODY:
                self.close_connection = True
                self._send(413, error_body(f"the body is {length} bytes, more than {MAX_BODY}"))
                return
            try:
                raw = self._read_chunked() if chunked else self.rfile.read(int(length))
            except TimeoutError:
                self._timed_out()
                return
            except ValueError as e:  # a malformed or oversized chunked body
                self.close_connection = True
                self._send(413 if "more than" in str(e) else 400, error_body(str(e)))
                return
            self.connection.settimeout(None)  # the request is in: answering it has no limit
            try:
                body = json.loads(raw.decode("utf-8"))
                too_deep = isinstance(body, (dict, list)) and _too_deep(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                self._send(400, error_body(f"the body is not JSON: {e}"))
                return
            except RecursionError:  # nested far deeper than MAX_DEPTH
                too_deep = True
            if too_deep:
                self._send(400, error_body(f"the body nests arrays/objects more than {MAX_DEPTH} levels deep; "
                                           "refusing it"))
                return
            if not isinstance(body, dict):
                self._send(400, error_body("the body must be a JSON object"))
                return
            server._handled(1)
            try:
                p = server.submit(path, body)
                if p.stream:
                    self._stream(p)
                elif self._wait_unless_gone(p):
                    self._send(p.status, p.body)
            finally:
                server._handled(-1)

        def _read_chunked(self):
            """A Transfer-Encoding: chunked body (RFC 9112 7.1, which HTTP/1.1 servers must take:
            clients send one for a body of unknown length). ValueError: malformed or too large."""
            body = bytearray()
            while True:
                line = self.rfile.readline(1024)
                digits = line.split(b";", 1)[0].strip()  # chunk extensions are ignored
                if not re.fullmatch(rb"[0-9A-Fa-f]{1,16}", digits):
                    raise ValueError("a chunked body ends before its last chunk" if not line else
                                     f"a chunked body has a bad chunk size line {line[:40]!r}")
                size = int(digits, 16)
                if len(body) + size > MAX_BODY:
                    raise ValueError(f"the chunked body is more than {MAX_BODY} bytes")
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailer fields
                        pass
                    return bytes(body)
                data = self.rfile.read(size)
                if len(data) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise ValueError("a chunked body ends inside a chunk")
                body += data

        def _wait_unless_gone(self, p):
            """Waits for p's answer; False once the client has closed its connection (as vLLM
            aborts it, the engine then ends the request at its next token: a client that timed
            out and retried would otherwise cost the batch a whole answer nobody reads)."""
            while not p.done.wait(CLIENT_POLL_S):
                try:  # b"": the client closed; data (a next request) or nothing yet: it is there
                    closed = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    p.gone = True
                    self.close_connection = True
                    return False
            return True

        def _stream(self, p):
            """Server-sent events: one "data: CHUNK" per chunk, then "data: [DONE]". A request that
            fails before its first chunk gets a plain error response; one that fails later, an
            error event. Chunks queued meanwhile go out in one write."""
            self.close_connection = True  # the stream ends with the connection (no length)
            ev = p.events.get()
            if ev[0] == "line" and ev[1] != 200:
                self._send(ev[1], ev[2])
                return
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                while True:
                    out, last = [], False
                    while not last:
                        if ev[0] == "chunk":
                            out.append(b"data: " + ev[1].encode("utf-8") + b"\n\n")
                        else:
                            if ev[1] != 200:
                                out.append(b"data: " + json.dumps(ev[2], ensure_ascii=False).encode("utf-8") + b"\n\n")
                            out.append(b"data: [DONE]\n\n")
                            last = True
                        try:
                            ev = p.events.get_nowait()
                        except queue.Empty:
                            break
                    self.wfile.write(b"".join(out))
                    self.wfile.flush()
                    if last:
                        return
                    ev = p.events.get()
            except (BrokenPipeError, ConnectionResetError):  # the client left: its request ends
                p.gone = True

    return Handler
