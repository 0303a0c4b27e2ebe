"""The OpenAI-compatible server's throughput against its ceiling, the same engine without HTTP.

N clients each POST one /v1/completions request at once (token-id prompts, greedy, fixed
max_tokens) to `python -m flexh2o serve`'s Server in this process; the ceiling is
`flexh2o.LLM._s.openai` on the same N lines in one call (what `flexh2o generate` runs for a
Batch file), and "one at a time" is the server with each client waiting for the previous
answer. Prints tokens/s of each and the ratios, best of --rounds, interleaved. Then latency
with mixed lengths (max_tokens 1/4, 2/4, 3/4 and all of --gen-len, concurrent): each request's
time to its answer, and a streamed one's to its first chunk, as fractions of the round's wall
time (a server that answers when the whole call ends: 1.0 for every request).

  PYTHONPATH=build/python python3 bench/serve_bench.py -m opt-125m --clients 32 --prompt-len 64 --gen-len 32
"""

import argparse
import http.client
import json
import os
import sys
import threading
import time

import flexh2o
from flexh2o.serve import Server


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise SystemExit(f"serve_bench: HTTP {r.status}: {out}")
    return out["usage"]["completion_tokens"]


def post_stream(port, body):
    """(seconds to the first chunk, completion tokens) of a streamed request."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True, stream_options={
        "include_usage": True})).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens = None, 0
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        first = time.perf_counter() - t0 if first is None else first
        chunk = json.loads(line[len(b"data: "):])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    c.close()
    return first, tokens


def concurrent(fn, n):
    """Runs fn(i) for i < n at once; (results, seconds from the start to each return)."""
    out, done = [None] * n, [0.0] * n
    t0 = time.perf_counter()

    def one(i):
        out[i] = fn(i)
        done[i] = time.perf_counter() - t0

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out, done


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="opt-125m")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--continuous", action="store_true", help="the server and engine with continuous batching")
    a = ap.parse_args()

    llm = flexh2o.LLM(a.model, device="cpu", batch_size=a.batch_size)
    bodies = [{"model": "m", "prompt": [(7 * i + 13 * t) % 1000 + 4 for t in range(a.prompt_len)],
               "max_tokens": a.gen_len, "temperature": 0} for i in range(a.clients)]
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": b})
             for i, b in enumerate(bodies)]
    server = Server(llm, "127.0.0.1", 0, max_new_tokens=a.gen_len, max_prompt_len=a.prompt_len,
                    max_batch_requests=a.clients, continuous=a.continuous, log=open(os.devnull, "w"))
    port = server.address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tokens = a.clients * a.gen_len
    llm._s.openai(lines[:1], max_tokens_cap=a.gen_len)  # warm up (places the runner)

    best = {"engine": 0.0, "server": 0.0, "serial": 0.0}
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        out = llm._s.openai(lines, max_tokens_cap=a.gen_len, plan_prompt_len=a.prompt_len,
                            plan_gen_len=a.gen_len, plan_requests=a.clients, continuous=a.continuous)
        best["engine"] = max(best["engine"], tokens / (time.perf_counter() - t0))
        assert all(json.loads(o)["response"]["status_code"] == 200 for o in out)

        got = [0] * a.clients
        t0 = time.perf_counter()
        ts = [threading.Thread(target=lambda i=i: got.__setitem__(i, post(port, bodies[i]))) for i in range(a.clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best["server"] = max(best["server"], sum(got) / (time.perf_counter() - t0))

        t0 = time.perf_counter()
        n = sum(post(port, b) for b in bodies[:max(1, a.clients // 4)])
        best["serial"] = max(best["serial"], n / (time.perf_counter() - t0))
    mixed = [dict(b, max_tokens=max(1, a.gen_len * (1 + i % 4) // 4)) for i, b in enumerate(bodies)]
    lat = {"answer": [], "first_chunk": []}
    for _ in range(a.rounds):
        n, done = concurrent(lambda i: post(port, mixed[i]), a.clients)
        lat["answer"].append(sum(done) / len(done) / max(done))
        best["mixed"] = max(best.get("mixed", 0.0), sum(n) / max(done))
        got, done = concurrent(lambda i: post_stream(port, mixed[i]), a.clients)
        lat["first_chunk"].append(sum(g[0] for g in got) / len(got) / max(done))
        best["streamed"] = max(best.get("streamed", 0.0), sum(g[1] for g in got) / max(done))
    server.close()

    print(f"model {a.model}, {a.clients} clients, prompt {a.prompt_len} + {a.gen_len} tokens, "
          f"engine batch {a.batch_size}{', continuous' if a.continuous else ''}, best of {a.rounds}:")
    print(f"  engine alone (one openai() call):       {best['engine']:9.1f} tok/s")
    print(f"  server, {a.clients} concurrent clients:       {best['server']:9.1f} tok/s  "
          f"({best['server'] / best['engine']:.2f} of the engine)")
    print(f"  server, one request at a time:          {best['serial']:9.1f} tok/s  "
          f"({best['serial'] / best['engine']:.2f} of the engine)")
    print(f"  mixed max_tokens, {a.clients} concurrent clients: {best['mixed']:9.1f} tok/s, streamed "
          f"{best['streamed']:9.1f} tok/s ({best['streamed'] / best['mixed']:.2f});")
    print(f"  mean time as a fraction of the round (median of {a.rounds}; without a tokenizer a stream's text "
          f"comes at its end):")
    for k, what in (("answer", "to the answer"), ("first_chunk", "to a streamed request's first chunk")):
        print(f"    {what:40s} {sorted(lat[k])[len(lat[k]) // 2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
