"""compare_table.py — the rows and the table of issue #13's GPU side-by-side (gpu_compare.sh).

Standard library only (it runs under whatever python3 the GPU image has). Every system's number
is FlexGen's rule, tokens generated / (prefill + decode) seconds, read from what the system
itself wrote: flexh2o's --report JSON, FlexGen's (and H2O's fork's) --log-file.
  compare_table.py add CSV --system S --model M --kv KV --workload W (--report R | --flexgen-log L |
                   --result J) -- ARGS
      appends one row; ARGS are the system's policy flags (batch and lowest tier come from them,
      or from flexh2o's report; J is {"tok_s", "batch", "tier"} from hf_accelerate_gpu.py). A run
      that wrote nothing usable is a row with tok/s 0.
  compare_table.py table CSV --md OUT.md --svg OUT.svg
      the paper-shaped table: per peer row, each flexh2o run of the same model, workload and KV
      ("flexh2o": the peer's policy; "flexh2o-auto": --policy auto), and the ratio flexh2o / peer;
      the same as grouped bars (log scale) in SVG.
"""
import argparse
import csv
import json
import math
import os
import re
import sys

# setup_s: seconds of flexh2o's prefill spent allocating and pinning the batch's buffers
# (offload.batch_setup_seconds; inside tok_s). FlexGen allocates its cache before its timer starts
# and does not pin it; a job of several equal batches pays ours once.
FIELDS = ["model", "workload", "kv", "system", "tok_s", "projected", "batch", "tier", "policy", "setup_s"]
# What each system runs before its timed run (each system's own code), said under the table.
WARMUPS = [("flexh2o", "flexh2o, `bench --warmup`: its first block's prefill, whose pinned buffers the timed run "
                       "reuses"),
           ("flexgen", "FlexGen, a 32-token prompt, 1 token (flex_opt.py)"),
           ("h2o-flexgen", "H2O's fork, none (its warm-up is commented out in its flex_opt.py): its prefill runs "
                           "cold"),
           ("accelerate", "accelerate, a 32-token prompt, 1 token (hf_accelerate_gpu.py)")]
COLORS = ["#e15759", "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2"]


def lowest_tier(percent):
    """The slowest tier a policy homes anything on. percent is FlexGen's six numbers: weights,
    cache and activations on the GPU and on the CPU, each pair's rest on disk."""
    if len(percent) != 6:
        raise ValueError(f"--percent needs 6 numbers, got {percent}")
    pairs = [(float(percent[i]), float(percent[i + 1])) for i in (0, 2, 4)]
    if any(100.0 - g - c > 1e-9 for g, c in pairs):
        return "disk"
    if any(c > 0 for _, c in pairs):
        return "cpu"
    return "gpu"


def policy_of(args):
    """(effective batch, lowest tier) from FlexGen-style flags; None where a flag is absent."""
    def value(flag, n=1):
        if flag not in args:
            return None
        i = args.index(flag)
        return args[i + 1:i + 1 + n]
    bs, nb, pct = value("--gpu-batch-size"), value("--num-gpu-batches"), value("--percent", 6)
    batch = int(bs[0]) * int(nb[0] if nb else 1) if bs else None
    return batch, (lowest_tier(pct) if pct else None)


def flexh2o_row(report):
    """tok/s, projected, batch, tier from a flexh2o --report JSON. A run stopped at its time cap
    (bench stops at a token step on SIGTERM) reports the part that ran: projected "cut"."""
    r = json.load(open(report))
    secs = r["prefill_seconds"] + r["decode_seconds"]
    tok_s = r["generated_tokens"] / secs if secs > 0 else 0.0
    projected = "cut" if r.get("interrupted") else "no"
    off = r.get("offload") or {}
    pol = off.get("policy")
    if pol:
        return tok_s, projected, pol["gpu_batch_size"] * pol["num_gpu_batches"], lowest_tier(pol["percent"])
    return tok_s, projected, r.get("batch_size"), "gpu"


def flexh2o_setup_seconds(report):
    """The report's batch setup seconds (buffers allocated and pinned at the prefill), or None."""
    return (json.load(open(report)).get("offload") or {}).get("batch_setup_seconds")


def flexgen_row(log):
    """tok/s and projected from the log FlexGen's write_benchmark_log writes."""
    text = open(log).read()
    # FlexGen appends to its log: the last run's lines are the last ones.
    tok = re.findall(r"total throughput: ([0-9.]+) token/s", text)
    proj = re.findall(r"projected: (True|False)", text)
    if not tok:
        raise ValueError(f"{log}: no 'total throughput' line")
    return float(tok[-1]), ("yes" if proj and proj[-1] == "True" else "no")


def add(a, rest):
    batch, tier = policy_of(rest)
    tok_s, projected, setup = 0.0, "?", None
    try:
        if a.report:
            tok_s, projected, batch, tier = flexh2o_row(a.report)
            setup = flexh2o_setup_seconds(a.report)
        elif a.flexgen_log:
            tok_s, projected = flexgen_row(a.flexgen_log)
        elif a.result:
            r = json.load(open(a.result))
            tok_s, projected, batch, tier = float(r["tok_s"]), "no", r["batch"], r["tier"]
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"compare_table: {a.system} {a.model} {a.kv}: no result ({e})", file=sys.stderr)
    new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
    with open(a.csv, "a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        w.writerow({"model": a.model, "workload": a.workload, "kv": a.kv, "system": a.system,
                    "tok_s": f"{tok_s:.4g}", "projected": projected, "batch": batch or "",
                    "tier": tier or "", "policy": " ".join(rest),
                    "setup_s": "" if setup is None else f"{setup:.3g}"})


def ours(row):
    """flexh2o's rows: "flexh2o" (the peer's policy) and variants such as "flexh2o-auto"."""
    return row["system"] == "flexh2o" or row["system"].startswith("flexh2o-")


def pairs(rows):
    """(peer row, one of our rows of the same model, workload and KV or None, ratio or nan): a
    line per peer row and each of our runs of its key, in the CSV's order."""
    key = lambda r: (r["model"], r["workload"], r["kv"])
    out = []
    for r in rows:
        if ours(r):
            continue
        mine = [o for o in rows if ours(o) and key(o) == key(r)] or [None]
        p = float(r["tok_s"])
        for o in mine:
            ratio = float(o["tok_s"]) / p if o and p > 0 and float(o["tok_s"]) > 0 else math.nan
            out.append((r, o, ratio))
    return out


def markdown(rows):
    lines = ["| model | workload | KV | peer | peer tok/s | batch | lowest tier | flexh2o run | tok/s | batch | "
             "lowest tier | of which setup s | flexh2o / peer | peer projected |",
             "|---|---|---|---|---:|---:|---|---|---:|---:|---|---:|---:|---|"]
    for r, o, ratio in pairs(rows):
        of = ((o["system"], f"{float(o['tok_s']):.2f}", o["batch"], o["tier"], o.get("setup_s") or "")
              if o else ("—", "—", "", "", ""))
        lines.append(f"| {r['model']} | {r['workload']} | {r['kv']} | {r['system']} | {float(r['tok_s']):.2f} | "
                     f"{r['batch']} | {r['tier']} | {of[0]} | {of[1]} | {of[2]} | {of[3]} | {of[4]} | "
                     f"{'—' if math.isnan(ratio) else f'{ratio:.2f}'} | {r['projected']} |")
    systems = {r["system"] for r in rows}
    said = [text for name, text in WARMUPS if name in systems or any(s.startswith(name + "-") for s in systems)]
    if said:
        lines += ["", "Warm-up before each timed run: " + "; ".join(said) + "."]
    return "\n".join(lines) + "\n"


def svg(rows, title):
    groups = []
    for r in rows:
        key = (r["model"], r["workload"], r["kv"])
        if key not in [g[0] for g in groups]:
            groups.append((key, []))
        next(g for g in groups if g[0] == key)[1].append(r)
    systems = []
    for r in rows:
        if r["system"] not in systems:
            systems.append(r["system"])
    vals = [float(r["tok_s"]) for r in rows if float(r["tok_s"]) > 0]
    lo = 10 ** math.floor(math.log10(min(vals))) if vals else 0.1
    hi = 10 ** math.ceil(math.log10(max(vals))) if vals else 10.0
    hi = max(hi, lo * 10)
    W, H, X0, Y0, Y1 = 200 + 170 * max(1, len(groups)), 420, 70, 340, 50
    y = lambda v: Y0 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (Y0 - Y1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{X0}" y="22" font-size="15" font-weight="bold">{title}</text>']
    d = lo
    while d <= hi * 1.0001:
        out.append(f'<line x1="{X0}" x2="{W - 140}" y1="{y(d):.1f}" y2="{y(d):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{X0 - 6}" y="{y(d) + 4:.1f}" text-anchor="end">{d:g}</text>')
        d *= 10
    out.append(f'<text transform="translate(18,{(Y0 + Y1) / 2:.0f}) rotate(-90)" text-anchor="middle">tokens/s (log scale)</text>')
    gw = (W - 140 - X0) / max(1, len(groups))
    for gi, (key, rs) in enumerate(groups):
        bw = gw * 0.8 / max(1, len(rs))
        x0 = X0 + gi * gw + gw * 0.1
        out.append(f'<text x="{X0 + (gi + 0.5) * gw:.1f}" y="{Y0 + 18}" text-anchor="middle">{key[0]} {key[1]}</text>')
        out.append(f'<text x="{X0 + (gi + 0.5) * gw:.1f}" y="{Y0 + 33}" text-anchor="middle">KV {key[2]}</text>')
        for i, r in enumerate(rs):
            v = float(r["tok_s"])
            color = COLORS[systems.index(r["system"]) % len(COLORS)]
            tip = f'{r["system"]}: {v:.3g} tok/s, batch {r["batch"]}, lowest tier {r["tier"]}, projected {r["projected"]}'
            if v > 0:
                out.append(f'<rect x="{x0 + i * bw:.1f}" y="{y(v):.1f}" width="{bw * 0.9:.1f}" height="{Y0 - y(v):.1f}" '
                           f'fill="{color}"><title>{tip}</title></rect>')
            else:
                out.append(f'<text x="{x0 + (i + 0.45) * bw:.1f}" y="{Y0 - 4}" text-anchor="middle" fill="{color}">'
                           f'×<title>{tip} (no result)</title></text>')
    out.append(f'<line x1="{X0}" x2="{X0}" y1="{Y1}" y2="{Y0}" stroke="black"/>')
    out.append(f'<line x1="{X0}" x2="{W - 140}" y1="{Y0}" y2="{Y0}" stroke="black"/>')
    for i, s in enumerate(systems):
        out.append(f'<rect x="{W - 130}" y="{Y1 + 18 * i}" width="12" height="12" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{W - 112}" y="{Y1 + 18 * i + 10}">{s}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a_ = sub.add_parser("add")
    a_.add_argument("csv")
    for f in ("--system", "--model", "--kv", "--workload"):
        a_.add_argument(f, required=True)
    src = a_.add_mutually_exclusive_group()
    src.add_argument("--report")
    src.add_argument("--flexgen-log")
    src.add_argument("--result")
    t_ = sub.add_parser("table")
    t_.add_argument("csv")
    t_.add_argument("--md")
    t_.add_argument("--svg")
    t_.add_argument("--title", default="Generation throughput, one GPU capped at 16 GiB")
    a = p.parse_args(argv)
    if a.cmd == "add":
        add(a, rest)
        return 0
    rows = list(csv.DictReader(open(a.csv)))
    md = markdown(rows)
    sys.stdout.write(md)
    if a.md:
        open(a.md, "w").write(md)
    if a.svg:
        open(a.svg, "w").write(svg(rows, a.title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
