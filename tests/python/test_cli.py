"""`python -m flexh2o` is the flexh2o command line: the same output and exit code as the
binary for help, usage errors and real runs."""

import json
import re

import pytest

from conftest import DATA, ROOT, TINY, run_binary, run_module


@pytest.mark.parametrize("args", [
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
    assert untimed(got.stdout) == untimed(want.stdout)
    assert timeless(got.stderr) == timeless(want.stderr)
    assert want.stdout or want.stderr


def test_help_is_the_binarys_and_names_serve():
    want, got = run_binary(["--help"]), run_module(["--help"])
    assert got.returncode == want.returncode == 0
    assert got.stdout.startswith(want.stdout)
    assert "serve" not in want.stdout and re.search(r"^  serve .*python -m flexh2o serve --help", got.stdout, re.M)


def untimed(out):
    """stdout without a JSON result's "seconds" (how long the run took)."""
    return re.sub(r'"seconds":[0-9][0-9.e+-]*', '"seconds":N', out)


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


def test_sigint_stops_generate_cleanly(tmp_path):
    # As the binary: the first SIGINT stops at a token step, finished results are kept, the
    # report says interrupted, the exit code is 130 (not a KeyboardInterrupt traceback).
    import os
    import signal
    import subprocess
    import sys
    import time

    inp, out, rep = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "report.json"
    inp.write_text("".join(json.dumps({"prompt_ids": [2, 100 + i]}) + "\n" for i in range(64)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.Popen([sys.executable, "-m", "flexh2o", "generate", "-m", str(TINY["llama"]), "--input", str(inp),
                          "--output", str(out), "--report", str(rep), "-n", "500", "--ignore-eos", "--quiet",
                          "--batch-size", "2", "--device", "cpu", "--progress", "never"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and (not out.exists() or out.stat().st_size == 0):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    done = [json.loads(l) for l in out.read_text().splitlines()]
    assert 0 < len(done) < 64 and all(len(d["token_ids"]) == 500 for d in done)
    assert json.loads(rep.read_text())["interrupted"] is True


def test_one_version_everywhere():
    """CMakeLists.txt's project() version is the binary's --version, the package's __version__ and,
    through pyproject.toml's regex, the wheel's."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    import flexh2o
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]["metadata"]["version"]
    assert meta["input"] == "CMakeLists.txt"
    found = re.search(meta["regex"], (ROOT / "CMakeLists.txt").read_text())
    assert found, "pyproject.toml's version regex finds nothing in CMakeLists.txt"
    version = found.group("value")
    assert flexh2o.__version__ == version
    out = run_binary(["--version"])
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"flexh2o {version} (")
    assert re.match(r"CPU kernels: (avx512|avx2|scalar) on this machine$", lines[1]), lines
    assert lines[2].startswith("CUDA backend: "), lines
