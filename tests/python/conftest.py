"""Shared fixtures of the Python package's tests: the tiny checkpoints of tests/data, the
built flexh2o binary (FLEXH2O_BINARY_DIR, else ./build) to compare against, and one loaded
LLM per tiny model (CPU device)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
TINY = {"opt": DATA / "tiny-opt", "llama": DATA / "tiny-llama"}
BINARY_DIR = Path(os.environ.get("FLEXH2O_BINARY_DIR", ROOT / "build"))
BINARY = BINARY_DIR / "flexh2o"


def run_binary(args, **kw):
    """The flexh2o binary with `args`: CompletedProcess with text stdout/stderr."""
    assert BINARY.is_file(), f"{BINARY} is not built"
    return subprocess.run([str(BINARY)] + [str(a) for a in args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def run_module(args, **kw):
    """`python -m flexh2o args` with this interpreter and this sys.path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-m", "flexh2o"] + [str(a) for a in args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, env=env, **kw)


def cli_generate(tmp_path, model, lines, *flags):
    """The binary's `generate` over JSONL `lines`: the parsed output lines."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    r = run_binary(["generate", "-m", model, "--input", inp, "--output", out, "--quiet", "--device", "cpu",
                    "--progress", "never", *flags])
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in out.read_text().splitlines()]


@pytest.fixture(scope="session")
def llms():
    import flexh2o
    return {k: flexh2o.LLM(str(p), device="cpu") for k, p in TINY.items()}


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
    """tiny-llama's tokenizer files with the tokenizer_config.json of data/ (a chat template)."""
    d = tmp_path_factory.mktemp("chat-tokenizer")
    for f in ("vocab.json", "merges.txt", "special_tokens_map.json"):
        shutil.copy(TINY["llama"] / f, d / f)
    shutil.copy(Path(__file__).parent / "data" / "chat_tokenizer_config.json", d / "tokenizer_config.json")
    return d


@pytest.fixture(scope="session")
def no_bos_tokenizer(tmp_path_factory):
    """tiny-llama's tokenizer that does not add its BOS to text (as SmolLM2's)."""
    d = tmp_path_factory.mktemp("no-bos-tokenizer")
    for f in ("vocab.json", "merges.txt", "special_tokens_map.json"):
        shutil.copy(TINY["llama"] / f, d / f)
    cfg = json.loads((TINY["llama"] / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = False
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d
