# bench/compare/compare_table.py, which turns each system's own output into issue #13's table:
# the tiers and batches read from policies, FlexGen's log format (as its write_benchmark_log
# writes it), a real flexh2o bench report, ratios and their gaps, and the SVG.
import importlib.util
import json
import math
import signal
import subprocess
import xml.etree.ElementTree as ET

import pytest

from conftest import BINARY, ROOT, TINY, run_binary

_spec = importlib.util.spec_from_file_location("compare_table", ROOT / "bench" / "compare" / "compare_table.py")
ct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ct)

# Two runs appended to one log, in FlexGen 0.1.8's write_benchmark_log format.
FLEXGEN_LOG = (
    "model size: 55.803 GB\tcache size: 33.469 GB\thidden size (p): 0.349 GB\n"
    "peak gpu mem: 14.210 GB\tprojected: True\n"
    "prefill latency: 40.000 s\tprefill throughput: 614.400 token/s\n"
    "decode latency: 100.000 s\tdecode throughput: 14.880 token/s\n"
    "total latency: 140.000 s\ttotal throughput: 10.971 token/s\n"
    "model size: 55.803 GB\tcache size: 33.469 GB\thidden size (p): 0.349 GB\n"
    "peak gpu mem: 14.210 GB\tprojected: False\n"
    "prefill latency: 30.500 s\tprefill throughput: 805.770 token/s\n"
    "decode latency: 60.250 s\tdecode throughput: 24.697 token/s\n"
    "total latency: 90.750 s\ttotal throughput: 16.926 token/s\n")


@pytest.mark.parametrize("percent,tier", [
    ([100, 0, 100, 0, 100, 0], "gpu"),
    ([20, 80, 0, 100, 0, 100], "cpu"),
    ([0, 100, 100, 0, 100, 0], "cpu"),
    ([20, 30, 0, 100, 0, 100], "disk"),      # half the weights on disk
    ([100, 0, 100, 0, 60, 20], "disk"),      # only activations reach the disk
    ([62.5, 37.5, 100, 0, 100, 0], "cpu"),   # fractions from a report
])
def test_lowest_tier(percent, tier):
    assert ct.lowest_tier(percent) == tier


def test_lowest_tier_refuses_a_short_policy():
    with pytest.raises(ValueError, match="6 numbers"):
        ct.lowest_tier([100, 0, 100])


def test_policy_of_flags():
    args = "--percent 20 80 0 100 0 100 --gpu-batch-size 48 --num-gpu-batches 3 --cpu-cache-compute".split()
    assert ct.policy_of(args) == (144, "cpu")
    assert ct.policy_of(["--gpu-batch-size", "8"]) == (8, None)
    assert ct.policy_of(["device_map", "gpu"]) == (None, None)


def test_flexgen_log_last_run_wins(tmp_path):
    log = tmp_path / "fg.log"
    log.write_text(FLEXGEN_LOG)
    assert ct.flexgen_row(log) == (16.926, "no")
    log.write_text(FLEXGEN_LOG.split("model size", 2)[1].join(["model size", ""]))
    assert ct.flexgen_row(log) == (10.971, "yes")
    log.write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    with pytest.raises(ValueError, match="total throughput"):
        ct.flexgen_row(log)


def test_flexh2o_report_of_a_real_bench_run(tmp_path):
    rep = tmp_path / "r.json"
    r = run_binary(["bench", "-m", TINY["opt"], "--prompt-len", "16", "--gen-len", "4", "--device", "cpu",
                    "--percent", "20", "80", "0", "100", "0", "100", "--gpu-batch-size", "2",
                    "--num-gpu-batches", "2", "--report", rep])
    assert r.returncode == 0, r.stderr
    j = json.loads(rep.read_text())
    tok_s, projected, batch, tier = ct.flexh2o_row(rep)
    assert tok_s == pytest.approx(j["generated_tokens"] / (j["prefill_seconds"] + j["decode_seconds"]), rel=1e-12)
    assert tok_s > 0 and projected == "no" and batch == 4 and tier == "cpu"
    setup = ct.flexh2o_setup_seconds(rep)
    assert setup == j["offload"]["batch_setup_seconds"] and 0 < setup < j["prefill_seconds"]


def test_a_warmup_pins_the_buffers_the_timed_run_reuses(tmp_path):
    # gpu_compare.sh runs our rows with --warmup, as FlexGen's benchmark warms up: the timed run
    # takes the warmup's pinned host buffers (the KV home here), and the offload section counts it
    # alone (its token steps are the timed run's).
    rep = tmp_path / "r.json"
    r = run_binary(["bench", "-m", TINY["opt"], "--prompt-len", "16", "--gen-len", "4", "--device", "cpu",
                    "--percent", "20", "80", "0", "100", "0", "100", "--cpu-cache-compute", "--gpu-batch-size", "2",
                    "--num-gpu-batches", "2", "--warmup", "--report", rep])
    assert r.returncode == 0, r.stderr
    j = json.loads(rep.read_text())
    off = j["offload"]
    assert j["warmup_seconds"] > 0 and j["generated_tokens"] == 4 * 4
    assert off["token_steps"] == 4
    assert off["batch_buffers_reused_bytes"] > 0
    cold = tmp_path / "cold.json"
    r = run_binary(["bench", "-m", TINY["opt"], "--prompt-len", "16", "--gen-len", "4", "--device", "cpu",
                    "--percent", "20", "80", "0", "100", "0", "100", "--cpu-cache-compute", "--gpu-batch-size", "2",
                    "--num-gpu-batches", "2", "--report", cold])
    assert r.returncode == 0, r.stderr
    c = json.loads(cold.read_text())
    assert c["warmup_seconds"] == 0 and c["offload"]["batch_buffers_reused_bytes"] == 0
    assert c["offload"]["token_steps"] == 4


def test_a_bench_cut_at_its_cap_reports_the_part_that_ran(tmp_path):
    # timeout(1)'s SIGTERM stops bench at a token step; its report is the part that ran.
    rep = tmp_path / "r.json"
    proc = subprocess.Popen([str(BINARY), "bench", "-m", str(TINY["opt"]), "--prompt-len", "8", "--gen-len", "1000",
                             "--num-prompts", "256", "--device", "cpu", "--report", str(rep), "--progress", "always"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    seen = ""
    while "[bench]" not in seen:  # the first progress line: tokens are being drawn (a slow load is no cut)
        line = proc.stderr.readline()
        assert line, "bench ended before its first step"
        seen += line
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    err = seen + err
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "interrupted: the part that ran" in out
    j = json.loads(rep.read_text())
    assert j["interrupted"] and 0 < j["generated_tokens"] < 256 * 1000
    tok_s, projected, _, _ = ct.flexh2o_row(rep)
    assert tok_s > 0 and projected == "cut"


def rows_of(tmp_path, entries):
    csv_path = tmp_path / "t.csv"
    for system, kv, value in entries:
        res = tmp_path / f"{system}-{kv}.json"
        res.write_text(json.dumps({"tok_s": value, "batch": 48, "tier": "cpu"}))
        assert ct.main(["add", str(csv_path), "--system", system, "--model", "opt-30b", "--kv", kv,
                        "--workload", "512+32", "--result", str(res), "--", "--gpu-batch-size", "48"]) == 0
    import csv
    return csv_path, list(csv.DictReader(open(csv_path)))


def test_ratios_pair_each_peer_with_our_row(tmp_path):
    _, rows = rows_of(tmp_path, [("flexh2o", "full", 12.0), ("flexgen", "full", 8.0),
                                 ("flexh2o", "h2o20", 30.0), ("h2o-flexgen", "h2o20", 0.0),
                                 ("accelerate", "w4", 2.0), ("flexh2o-auto", "full", 20.0)])
    got = [(r["system"], o["system"] if o else None, ratio) for r, o, ratio in ct.pairs(rows)]
    assert got[0] == ("flexgen", "flexh2o", 1.5)
    assert got[1] == ("flexgen", "flexh2o-auto", 2.5)                              # each of our runs
    assert got[2][:2] == ("h2o-flexgen", "flexh2o") and math.isnan(got[2][2])   # the peer failed
    assert got[3][:2] == ("accelerate", None) and math.isnan(got[3][2])          # we have no row
    md = ct.markdown(rows).splitlines()
    assert len(md) == 2 + 4 + 2
    assert "| 1.50 |" in md[2] and "| 2.50 |" in md[3] and "| — |" in md[4] and "| — |" in md[5]
    # Under the table, each system's warm-up: H2O's fork runs its prefill cold.
    assert md[6] == "" and md[7].startswith("Warm-up before each timed run: flexh2o, `bench --warmup`")
    assert "H2O's fork, none" in md[7] and "FlexGen, a 32-token prompt" in md[7] and "accelerate" in md[7]


def test_a_missing_result_is_a_zero_row(tmp_path):
    csv_path = tmp_path / "t.csv"
    assert ct.main(["add", str(csv_path), "--system", "flexgen", "--model", "opt-30b", "--kv", "full",
                    "--workload", "512+32", "--flexgen-log", str(tmp_path / "absent.log"), "--",
                    "--percent", "20", "80", "0", "100", "0", "100", "--gpu-batch-size", "48"]) == 0
    line = csv_path.read_text().splitlines()[1].split(",")
    assert line[3:8] == ["flexgen", "0", "?", "48", "cpu"]


def test_svg_is_well_formed_with_a_bar_per_result(tmp_path):
    _, rows = rows_of(tmp_path, [("flexh2o", "full", 12.0), ("flexgen", "full", 8.0),
                                 ("h2o-flexgen", "h2o20", 0.0)])
    root = ET.fromstring(ct.svg(rows, "t"))
    bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.find("{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) == 2
    heights = {b.find("{http://www.w3.org/2000/svg}title").text.split(":")[0]: float(b.get("height")) for b in bars}
    assert heights["flexh2o"] > heights["flexgen"] > 0
