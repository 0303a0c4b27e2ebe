"""`python -m flexh2o serve`: an OpenAI-compatible HTTP server over one flexh2o.LLM.

POST /v1/completions and /v1/chat/completions take the bodies OpenAI's API takes (what
`flexh2o generate` accepts in an OpenAI Batch file, checked by the same code) and answer in
OpenAI's shapes; GET /v1/models and /health. Requests that arrive together run together: the
engine thread takes every request queued (after --batch-wait-ms from the first) as one call,
which the engine cuts into its batches, so concurrent clients get the offloading engine's
throughput. Each request is answered as soon as its own choices end, not when the call ends;
"stream": true sends its text as server-sent events while the tokens are drawn; a client that
disconnects, streaming or not, ends its request at the next token. With --continuous, a request that
arrives while a call runs joins its batch when a slot frees. "echo" with "logprobs" (a completion
that also scores its prompt, as lm-eval's local-completions asks) is scored before a call generates."""

import argparse
import json
import queue
import re
import secrets
import math
import signal
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from ._flexh2o import Error, StopFlag, check_sampling_defaults
from ._serve_http import READ_TIMEOUT, _handler_for, error_body

CLOSE_WAIT = 10.0  # seconds close() waits for answers to be written


class _HTTPServer(ThreadingHTTPServer):
    # Many clients connect at once (that is how they share a batch): socketserver's default
    # backlog of 5 would drop or reset connections beyond it.
    request_queue_size = 1024


class _Pending:
    """One request waiting for the engine: its Batch input line, then its (status, body); a
    streamed one also gets its chunks, in `events` as ("chunk", json_text), then ("line", status,
    body). Written by the engine thread, read by the request's handler thread."""

    def __init__(self, line, stream):
        self.line, self.stream = line, stream
        self.events = queue.SimpleQueue()
        self.done = threading.Event()
        self.status = 500
        self.body = error_body("no answer", "server_error")
        self.gone = False  # the client disconnected (the engine then ends the request)

    def chunk(self, text):
        """Queues a chunk; False once the client has gone (the engine then ends the request)."""
        self.events.put(("chunk", text))
        return not self.gone

    def answer(self, status, body):
        """The final answer; later ones are ignored (a request answered early keeps its answer
        when the call fails afterwards)."""
        if self.done.is_set():
            return
        self.status, self.body = status, body
        self.events.put(("line", status, body))
        self.done.set()


class Server:
    """The HTTP server and its engine thread. `llm` is a flexh2o.LLM, used only by the engine
    thread while the server runs. `port` 0 picks a free port (see `address`)."""

    def __init__(self, llm, host="127.0.0.1", port=8000, *, served_model_name=None, max_new_tokens=256,
                 max_prompt_len=512, batch_wait_ms=20.0, max_batch_requests=256, api_key=None, seed=None,
                 greedy=False, top_k=0, min_p=0.0, repetition_penalty=1.0, ignore_eos=False, continuous=False,
                 read_timeout=READ_TIMEOUT, log=sys.stderr, log_requests=False):
        if max_new_tokens < 1 or max_prompt_len < 1 or max_batch_requests < 1 or batch_wait_ms < 0:
            raise ValueError("max_new_tokens, max_prompt_len and max_batch_requests must be >= 1, "
                             "batch_wait_ms >= 0")
        if not read_timeout > 0:
            raise ValueError(f"read_timeout must be > 0 seconds, got {read_timeout}")
        why = _sampling_error(top_k, min_p, repetition_penalty)
        if why:
            raise ValueError(why)
        self.llm = llm
        self.model_name = served_model_name or llm.name
        self.max_new_tokens, self.max_prompt_len = int(max_new_tokens), int(max_prompt_len)
        self.batch_wait = float(batch_wait_ms) / 1000.0
        self.max_batch_requests = int(max_batch_requests)
        self.api_key = api_key
        self.seed = seed
        self.sampling = dict(greedy=bool(greedy), top_k=int(top_k), min_p=float(min_p),
                             repetition_penalty=float(repetition_penalty), ignore_eos=bool(ignore_eos))
        self.continuous = bool(continuous)
        self.read_timeout = float(read_timeout)
        self.log, self.log_requests = log, log_requests
        self.created = int(time.time())
        self.requests = self.batches = 0  # answered by the engine; engine calls
        self._queue = []
        self._cv = threading.Condition()
        self._closing = False
        self._stop = StopFlag()
        self._next_id = 0
        self._handling = 0  # POSTs between submit and their last byte written (close() waits for them)
        # The weights are placed now (for the workload the bounds allow), not on the first request:
        # a budget too small fails here, and the first request starts at once.
        llm._s.prepare(self.max_prompt_len, self.max_new_tokens, self.max_batch_requests)
        self._httpd = _HTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._engine = threading.Thread(target=self._engine_loop, name="flexh2o-engine", daemon=True)
        self._engine.start()

    @property
    def address(self):
        host, port = self._httpd.server_address[:2]
        return host, port

    def serve_forever(self):
        self._httpd.serve_forever(poll_interval=0.2)

    def close(self):
        """Stops accepting requests, ends the running engine call within its step under way and
        answers every waiting request 503. Call from another thread than serve_forever's, or
        after it returned."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._engine.join()
        # Every waiting request has its answer now; the handler threads are daemons, so let them
        # write it before the process may exit (a client that does not read gets CLOSE_WAIT s).
        deadline = time.monotonic() + CLOSE_WAIT
        with self._cv:
            while self._handling and time.monotonic() < deadline:
                self._cv.wait(deadline - time.monotonic())

    def _handled(self, delta):
        with self._cv:
            self._handling += delta
            self._cv.notify_all()

    # ---- the engine thread

    def submit(self, url, body):
        """Queues one request (url: an endpoint, body: the parsed JSON) and returns its _Pending
        (answered at once with 503 while the server is closing)."""
        with self._cv:
            self._next_id += 1
            line = json.dumps({"custom_id": f"req-{self._next_id}", "method": "POST", "url": url, "body": body})
            p = _Pending(line, body.get("stream") is True)
            if self._closing:
                p.answer(503, error_body("the server is shutting down", "server_error"))
                return p
            self._queue.append(p)
            self._cv.notify_all()
        return p

    def _take(self):
        """The next requests to run together: waits for one, then up to batch_wait for more."""
        with self._cv:
            while not self._queue and not self._closing:
                self._cv.wait()
            if self._closing:
                return None
            deadline = time.monotonic() + self.batch_wait
            while len(self._queue) < self.max_batch_requests and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            taken = self._queue[:self.max_batch_requests]
            del self._queue[:len(taken)]
            return taken

    def model_card(self):
        """The served model as /v1/models lists it; max_model_len as vLLM gives it (the model's
        positions), which clients read to size their requests."""
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "flexh2o"}
        if getattr(self.llm, "max_length", None):
            card["max_model_len"] = self.llm.max_length
        return card

    def _render_chat(self, body_text):
        body = json.loads(body_text)
        return self.llm._render_body(body)

    def _more_lines(self, taken):
        """With --continuous, called inside an engine call while its batch has free slots: the
        requests queued since, which join the running call (appended to `taken`)."""
        with self._cv:
            if self._closing:
                return []
            new = self._queue[:self.max_batch_requests]
            del self._queue[:len(new)]
        taken.extend(new)
        return [p.line for p in new]

    def _engine_loop(self):
        while True:
            taken = self._take()
            if taken is None:
                break
            seed = self.seed if self.seed is not None else secrets.randbits(63)
            t0 = time.monotonic()
            tokens = 0
            deferred = []  # requests that joined but did not fit the running batch: the next call's

            def on_event(i, kind, payload):  # on this thread, inside the call
                nonlocal tokens
                if kind == "chunk":
                    return taken[i].chunk(payload)
                if kind == "alive":
                    return not taken[i].gone
                if kind == "defer":
                    deferred.append(taken[i])
                    return True
                resp = json.loads(payload)["response"]
                tokens += resp["body"].get("usage", {}).get("completion_tokens", 0)
                taken[i].answer(resp["status_code"], resp["body"])
                return True

            more = (lambda: self._more_lines(taken)) if self.continuous else None
            try:
                # Under the LLM's call lock, as its own calls: a thread that also calls this LLM
                # directly reads its own call's report, never the server's.
                with self.llm._call_lock:
                    out = self.llm._s.openai([p.line for p in taken], seed=seed, max_tokens_cap=self.max_new_tokens,
                                             plan_prompt_len=self.max_prompt_len, plan_gen_len=self.max_new_tokens,
                                             plan_requests=self.max_batch_requests, render_chat=self._render_chat,
                                             stop=self._stop, stream=True, on_event=on_event,
                                             continuous=self.continuous, more_lines=more, model_name=self.model_name,
                                             **self.sampling)
            except Exception as e:  # noqa: BLE001 - every client still waiting gets the reason
                out = None
                if self._stop.is_set():
                    for p in taken:
                        p.answer(503, error_body("the server is shutting down", "server_error"))
                else:
                    print(f"flexh2o serve: engine error: {e}", file=self.log, flush=True)
                    for p in taken:
                        if p not in deferred:
                            p.answer(500, error_body(str(e), "server_error"))
            finally:
                if self.seed is not None:
                    self.seed += len(taken)  # requests without a "seed" never repeat one another's
                with self._cv:  # the deferred run next, before what came after them
                    self._queue[0:0] = [p for p in deferred if not p.done.is_set()]
                    self._cv.notify_all()
            if out is None:
                continue
            for p, text in zip(taken, out):  # answered by their events already, unless the engine gave none
                if text != "null":
                    resp = json.loads(text)["response"]
                    p.answer(resp["status_code"], resp["body"])
            ran = len(taken) - len(deferred)
            self.requests += ran
            self.batches += 1
            dt = time.monotonic() - t0
            left = sum(p.gone for p in taken)  # requests whose client left before its answer
            refused = sum(1 for p in taken if p.done.is_set() and 400 <= p.status < 500)
            print(f"flexh2o serve: {ran} request(s), {tokens} tokens in {dt:.2f} s "
                  f"({tokens / dt if dt > 0 else 0:.1f} tok/s)" + (f"; {refused} refused" if refused else "")
                  + (f"; {left} of them lost their client" if left else ""), file=self.log, flush=True)
        with self._cv:  # closing: whatever still waits
            for p in self._queue:
                p.answer(503, error_body("the server is shutting down", "server_error"))
            self._queue.clear()


def _sampling_error(top_k, min_p, repetition_penalty):
    """Why serve's sampling defaults cannot run (a request that leaves them to the server would
    get the server's mistake as its own 400), or None: the engine's own check of generate's flags."""
    try:
        check_sampling_defaults(int(top_k), float(min_p), float(repetition_penalty))
    except Error as e:
        return str(e)
    return None


def _flag_error(args):
    """What is wrong with serve's own flags (a wrong command line: exit 2), or None."""
    if not 0 <= args.port <= 65535:
        return f"--port must be in [0, 65535] (0: any free one), got {args.port}"
    for flag, v in (("--max-new-tokens", args.max_new_tokens), ("--max-prompt-len", args.max_prompt_len),
                    ("--max-batch-requests", args.max_batch_requests), ("--batch-size", args.batch_size),
                    ("--threads", args.threads)):
        if v is not None and v < 1:
            return f"{flag} must be at least 1, got {v}"
    if not (args.batch_wait_ms >= 0 and math.isfinite(args.batch_wait_ms)):
        return f"--batch-wait-ms must be a finite number of milliseconds >= 0, got {args.batch_wait_ms:g}"
    if not (args.read_timeout > 0 and math.isfinite(args.read_timeout)):
        return f"--read-timeout must be a finite number of seconds > 0, got {args.read_timeout:g}"
    return None


def _listen_error(host, port):
    """Why the server could not listen on (host, port) (a port in use, an unknown host), found
    before the model loads, which for a large one takes minutes; or None."""
    s = socket.socket(_HTTPServer.address_family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        s.bind((host, port))
    except (OSError, UnicodeError) as e:
        return f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}"
    finally:
        s.close()
    return None


def _engine_flags(rest):
    """The CLI's engine flags left over by argparse (`--percent 20 80 0 100 0 100`,
    `--cpu-cache-compute`, `--kv-policy=h2o`) as flexh2o.LLM keyword arguments."""
    flags, name = {}, None
    for tok in rest:
        if tok.startswith("--"):
            key, eq, value = tok[2:].partition("=")
            if not key:
                raise SystemExit(f"flexh2o serve: unexpected argument {tok!r}")
            name = key.replace("-", "_")
            flags[name] = [value] if eq else []
        elif name is None:
            raise SystemExit(f"flexh2o serve: unexpected argument {tok!r} (engine flags start with --)")
        else:
            flags[name].append(tok)
    return {k: (True if not v else v[0] if len(v) == 1 else v) for k, v in flags.items()}


# `generate`'s sampling flags that are fields of an OpenAI request: each request says them
# (OpenAI's default when it does not), as in a Batch file given to `generate`.
REQUEST_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logprobs")


def _not_engine_flag(rest):
    """Why a flag left over by argparse is none of serve's (None when all may be engine flags):
    generate's flags that serve leaves to each request, named as the user wrote them."""
    for tok in rest:
        if not tok.startswith("--"):
            continue
        spelled = tok.partition("=")[0]
        name = spelled[2:].replace("-", "_")
        if name in REQUEST_FIELDS:
            return (f"{spelled} is a request field in serve, not a flag: each request sets \"{name}\" "
                    "(OpenAI's default when it does not); serve's own sampling flags are --greedy, --top-k, --min-p, "
                    "--repetition-penalty, --ignore-eos and --seed")
        if name == "generation_config":
            return (f"{spelled} is not taken: request fields not given take OpenAI's defaults; the sampling "
                    "values of the model's generation_config.json are not read (its eos_token_id is)")
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m flexh2o serve",
        description="An OpenAI-compatible server (POST /v1/completions, /v1/chat/completions; GET /v1/models, "
                    "/health) over the flexh2o engine. Concurrent requests run together in the engine's "
                    "batches; each is answered when its own choices end, and \"stream\": true sends "
                    "server-sent events as tokens are drawn. Any other --flag is an engine flag of `flexh2o "
                    "generate` (offloading, KV policy, compression), e.g. --percent 20 80 0 100 0 100 --kv-policy "
                    "h2o --heavy-ratio 0.1 --recent-ratio 0.1. generate's sampling flags that OpenAI requests carry "
                    "(--temperature, --top-p, --presence-penalty, --frequency-penalty, --logprobs) are each "
                    "request's fields here.",
        epilog="Example: python -m flexh2o serve -m tests/data/tiny-opt --port 8000  then  curl "
               "localhost:8000/v1/completions -H 'Content-Type: application/json' -d "
               "'{\"model\": \"m\", \"prompt\": \"In the beginning\", \"max_tokens\": 8}'")
    ap.add_argument("-m", "--model", required=True, help="model directory, hub id in the local HF cache, or preset")
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    ap.add_argument("--batch-size", type=int, help="sequences per engine batch (default 8; with offloading "
                    "flags the policy's block, 4 x 1 by default: given, it is --gpu-batch-size, unless "
                    "--gpu-batch-size / --num-gpu-batches / --policy set the block)")
    ap.add_argument("--threads", type=int, help="CPU threads (default: all cores)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                    "only; 0.0.0.0 for every interface)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one)")
    ap.add_argument("--served-model-name", help="the model id /v1/models lists (default: the config's name)")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=256, help="the most tokens a request may generate "
                    "(a larger max_tokens is refused; a chat request without one gets up to this many; default 256)")
    ap.add_argument("--max-prompt-len", type=int, default=512, help="the prompt length --policy auto plans for "
                    "(longer prompts still run; default 512)")
    ap.add_argument("--batch-wait-ms", type=float, default=20.0, help="after a request arrives, how long the "
                    "engine waits for others to run with it (default 20)")
    ap.add_argument("--max-batch-requests", type=int, default=256, help="the most requests one engine call "
                    "takes (default 256)")
    ap.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every /v1 request")
    ap.add_argument("--seed", type=int, help="base seed of requests without a \"seed\" (default: random)")
    ap.add_argument("--greedy", action="store_true", help="temperature 0 whatever a request says")
    ap.add_argument("--top-k", type=int, default=0, help="top-k of requests without \"top_k\" (vLLM's extra "
                    "parameter; 0 or -1: off)")
    ap.add_argument("--min-p", type=float, default=0.0, help="min-p of requests without \"min_p\" (0: off)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0, help="transformers' repetition penalty of "
                    "requests without \"repetition_penalty\" (1: off)")
    ap.add_argument("--ignore-eos", action="store_true", help="every request generates exactly its max_tokens (EOS "
                    "does not end it; stop strings still do), as `generate --ignore-eos` runs a Batch file: for "
                    "benchmarks. One request alone: \"logit_bias\" -100 on the EOS token")
    ap.add_argument("--read-timeout", type=float, default=READ_TIMEOUT, help="seconds a client may take to send "
                    f"a request, headers and body (then 408 and the connection closed; default {READ_TIMEOUT:g}). "
                    "Generating and streaming the answer have no limit")
    ap.add_argument("--continuous", action="store_true", help="continuous batching: a request whose answer ends "
                    "hands its batch slot to the next (as `generate --continuous`), and requests that arrive while "
                    "the engine runs join its batch instead of waiting for the next call (those longer than "
                    "--max-prompt-len + --max-new-tokens wait)")
    ap.add_argument("--log-requests", action="store_true", help="log every HTTP request to stderr")
    args, rest = ap.parse_known_args(argv)
    flags = _engine_flags(rest)
    why = _flag_error(args) or _not_engine_flag(rest) or _sampling_error(args.top_k, args.min_p,
                                                                         args.repetition_penalty)
    if why:
        print(f"flexh2o serve: {why}", file=sys.stderr)
        return 2
    why = _listen_error(args.host, args.port)
    if why:
        print(f"flexh2o serve: {why}", file=sys.stderr)
        return 1
    spelled = {tok[2:].partition("=")[0].replace("-", "_"): tok.partition("=")[0] for tok in rest
               if tok.startswith("--")}

    import flexh2o
    try:
        llm = flexh2o.LLM(args.model, tokenizer=args.tokenizer, device=args.device, batch_size=args.batch_size,
                          threads=args.threads, generation_config="none", **flags)
    except TypeError as e:  # an engine flag that is none of the CLI's
        m = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        what = f"unknown flag {spelled.get(m[1], m[1])}" if m else str(e)
        print(f"flexh2o serve: {what} (serve's flags: --help; engine flags: `flexh2o generate --help`)",
              file=sys.stderr)
        return 2
    except (Error, ValueError, OSError) as e:
        print(f"flexh2o serve: {e}", file=sys.stderr)
        return 1
    try:
        server = Server(llm, args.host, args.port, served_model_name=args.served_model_name,
                        max_new_tokens=args.max_new_tokens, max_prompt_len=args.max_prompt_len,
                        batch_wait_ms=args.batch_wait_ms, max_batch_requests=args.max_batch_requests,
                        api_key=args.api_key, seed=args.seed, greedy=args.greedy, top_k=args.top_k,
                        min_p=args.min_p, repetition_penalty=args.repetition_penalty, ignore_eos=args.ignore_eos,
                        continuous=args.continuous, read_timeout=args.read_timeout, log_requests=args.log_requests)
    except OSError as e:  # the address taken since _listen_error
        print(f"flexh2o serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    except (Error, ValueError) as e:
        print(f"flexh2o serve: {e}", file=sys.stderr)
        return 1
    host, port = server.address
    print(f"flexh2o serve: {server.model_name} on http://{host}:{port}/v1 (Ctrl-C stops)", file=sys.stderr,
          flush=True)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # A shell starts a background job with SIGINT ignored, and Python then leaves it so: a
    # server started with `&` would not stop on `kill -INT`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("flexh2o serve: stopping (the running batch ends within its step under way; a second Ctrl-C "
              "ends the process at once)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server.close()  # serve_forever has returned: this ends the engine and answers what waits
    return 0
