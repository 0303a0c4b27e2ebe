"""`python -m flexh2o` is the flexh2o command line: the same output and exit code as the
binary for help, usage errors and real runs."""

import json
import re

import pytest

from conftest import DATA, TINY, run_binary, run_module


@pytest.mark.parametrize("args", [
    ["--help"],
    ["generate", "--help"],
    ["generate"],                      # a usage error: --model is required
    ["no-such-command"],
    ["--version"],
    ["info", TINY["llama"], "--json"],
    ["info", "opt-1.3b"],              # a preset: configs/ reached from the package
    ["generate", "-m", TINY["opt"], "--prompt", "In the beginning", "--greedy", "-n", "8", "--device", "cpu"],
    ["generate", "-m", TINY["opt"], "--prompt", "x", "--gpu-mem", "lots", "--device", "cpu"],
    ["eval-ppl", "-m", TINY["llama"], "--max-tokens", "16", "--json", "--device", "cpu",
     DATA / "tiny-llama" / "reference" / "eval.txt"],
])
def test_same_as_the_binary(args):
    want, got = run_binary(args), run_module(args)
    assert got.returncode == want.returncode
    assert got.stdout == want.stdout
    assert timeless(got.stderr) == timeless(want.stderr)
    assert want.stdout or want.stderr


def timeless(log):
    """stderr without the numbers that change from run to run (seconds, tokens/s)."""
    return re.sub(r"[0-9][0-9.e+-]*", "N", log)


def test_exit_codes(tmp_path):
    assert run_module(["--help"]).returncode == 0
    assert run_module(["generate"]).returncode == 2
    assert run_module(["info", tmp_path / "missing"]).returncode == 1
    # A bad input line: exit 1, the others still run (as the binary).
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text('{"prompt": "Grace"}\n{"prompt_ids": [999999]}\n')
    r = run_module(["generate", "-m", TINY["opt"], "--input", inp, "--output", out, "-n", "3", "--quiet",
                    "--device", "cpu"])
    assert r.returncode == 1
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert "token_ids" in lines[0] and "error" in lines[1]
