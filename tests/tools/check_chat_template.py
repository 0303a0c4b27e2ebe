#!/usr/bin/env python3
"""Developer check (not run by CI): flexh2o's chat-template rendering against Hugging Face
transformers' apply_chat_template on the test fixture (tiny-llama's tokenizer files with
tests/python/data/chat_tokenizer_config.json) and the conversations of tests/python/test_chat.py
and test_chat_continue.py (continue_final_message, template variables).
Needs a venv with transformers (no torch needed) and PYTHONPATH=build/python:
  /work/venvs/py/bin/pip install transformers jinja2
  PYTHONPATH=build/python /work/venvs/py/bin/python tests/tools/check_chat_template.py
Prints one line per case and exits 1 on any difference."""

import shutil
import sys
import tempfile
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from flexh2o._chat import ChatTemplate  # noqa: E402
from test_chat import CASES  # noqa: E402
from test_chat_continue import CONTINUE_CASES  # noqa: E402

with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    for f in ("vocab.json", "merges.txt", "special_tokens_map.json"):
        shutil.copy(ROOT / "tests" / "data" / "tiny-llama" / f, d / f)
    shutil.copy(ROOT / "tests" / "python" / "data" / "chat_tokenizer_config.json", d / "tokenizer_config.json")
    hf = AutoTokenizer.from_pretrained(str(d))
    ours = ChatTemplate.from_dir(d)
    bad = 0
    for name, messages, gen, _ in CASES:
        want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        got = ours.render(messages, add_generation_prompt=gen)
        same = got == want
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'}: {name}")
        if not same:
            print(f"  transformers: {want!r}\n  flexh2o:      {got!r}")
    for name, template, messages, kw, want in CONTINUE_CASES:
        extra = {} if template is None else {"chat_template": template}
        theirs = hf.apply_chat_template(messages, tokenize=False, **{"add_generation_prompt": True, **kw, **extra})
        got = (ours if template is None else ChatTemplate(template, ours.special, "case")).render(messages, **kw)
        same = got == theirs == want
        bad += not same
        print(f"{'same' if same else 'DIFFERENT'}: {name}")
        if not same:
            print(f"  transformers: {theirs!r}\n  flexh2o:      {got!r}\n  test expects: {want!r}")
    print(f"transformers {__import__('transformers').__version__}, jinja2 {__import__('jinja2').__version__}")
    sys.exit(1 if bad else 0)
