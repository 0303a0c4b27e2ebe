"""LLM.apply_chat_template: tokenizer_config.json's chat_template rendered as transformers
renders it (tests/tools/check_chat_template.py checks CASES against transformers itself), the
list form, the missing-template error, and the `generate` chat hook of `python -m flexh2o`."""

import json
import shutil

import pytest

import flexh2o
from conftest import TINY, run_binary, run_module
from flexh2o.__main__ import render_chat
from flexh2o._chat import ChatTemplate

# (name, messages, add_generation_prompt, what transformers renders)
CASES = [
    ("system folded into the first turn, content trimmed",
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  Who created the heaven?  "}],
     True, '<s>\n[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWho created the heaven? [/INST]\n<|assistant|>\n'),
    ("multi-turn without the generation prompt",
     [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Grace be unto you."},
      {"role": "user", "content": "And peace?"}],
     False, '<s>\n[INST] Hello [/INST]\n Grace be unto you. </s>\n[INST] And peace? [/INST]\n'),
    ("structured content through tojson (not ASCII-escaped)",
     [{"role": "user", "content": [{"type": "text", "text": 'héllo "x"'}]}],
     True, '<s>\n[INST] [{"type": "text", "text": "héllo \\"x\\""}] [/INST]\n<|assistant|>\n'),
    ("loop controls: break",
     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "final": True},
      {"role": "user", "content": "c"}],
     True, '<s>\n[INST] a [/INST]\n b </s>\n<|assistant|>\n'),
]


@pytest.fixture(scope="module")
def chat_llm(chat_tokenizer):
    return flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")


@pytest.mark.parametrize("name, messages, gen, want", CASES, ids=[c[0] for c in CASES])
def test_renders_as_transformers(chat_llm, name, messages, gen, want):
    assert chat_llm.apply_chat_template(messages, add_generation_prompt=gen) == want


def test_rendered_prompt_tokenizes_special_tokens(chat_llm):
    text = chat_llm.apply_chat_template(CASES[0][1])
    ids = chat_llm.encode(text, add_special=False)
    assert ids[0] == chat_llm.bos_id and chat_llm.encode(text)[:2] == [chat_llm.bos_id, chat_llm.bos_id]
    assert chat_llm.decode(ids) == text


def test_raise_exception_is_an_error(chat_llm):
    with pytest.raises(flexh2o.Error, match="chat template: Conversation roles must alternate"):
        chat_llm.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_strftime_now_and_list_form(tmp_path, chat_tokenizer):
    d = tmp_path / "tok"
    shutil.copytree(chat_tokenizer, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "tools"},
                            {"name": "default", "template": "{{ eos_token }}{{ strftime_now('%Y') | length }}"
                                                            "{% for m in messages %}|{{ m.content }}{% endfor %}"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(d), device="cpu")
    assert llm.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "</s>4|a|b"
    cfg["chat_template"] = [{"name": "tool_use", "template": "tools"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(flexh2o.Error, match='list without a "default" entry \\(names: tool_use\\)'):
        flexh2o.LLM(str(TINY["llama"]), tokenizer=str(d), device="cpu").apply_chat_template([])


def _with_template(tmp_path, chat_tokenizer, template):
    """A copy of the chat tokenizer's directory whose tokenizer_config.json has `template`."""
    d = tmp_path / "tok"
    shutil.copytree(chat_tokenizer, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_messages_are_normalised_as_transformers_5_does(tmp_path, chat_tokenizer):
    # Keys whose value is None dropped (only at the message's top level), reasoning aliased; the
    # expected text is transformers 5.25's apply_chat_template of the same messages and template.
    d = _with_template(tmp_path, chat_tokenizer, "{% for m in messages %}{{ m | tojson }}|{% endfor %}")
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(d), device="cpu")
    m = [{"role": "user", "content": "a", "name": None},
         {"role": "assistant", "content": None, "reasoning": "why",
          "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": None}}}]}]
    assert llm.apply_chat_template(m) == (
        '{"role": "user", "content": "a"}|{"thinking": "why", "role": "assistant", "reasoning": "why", "tool_calls": '
        '[{"function": {"name": "f", "arguments": {"b": 1, "a": null}}}], "reasoning_content": "why"}|')
    assert m[1]["content"] is None  # the caller's messages are left as they were
    with pytest.raises(flexh2o.Error, match="message 1 must be a dict"):
        llm.apply_chat_template([{"role": "user", "content": "a"}, "b"])
    with pytest.raises(flexh2o.Error, match="conversation 1 must be a non-empty list"):
        llm.chat([[{"role": "user", "content": "a"}], []])


@pytest.mark.parametrize("template, want", [
    # Loops over content (Gemma 3's form, and through a variable): the parts reach it as a list.
    ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
     "{% for p in m['content'] %}[{{ p['text'] | trim }}]{% endfor %}{% endif %}|{% endfor %}", "[a][b]|"),
    ("{% for m in messages %}{% set c = m.content %}{% for p in c %}<{{ p.text }}>{% endfor %}{% endfor %}",
     "<a><b>"),
    ("{% for m in messages %}{% for p in m.content | list %}({{ p.text }}){% endfor %}{% endfor %}", "(a)(b)"),
    # Reads content as text: the parts' texts joined by newlines, as vLLM gives such a template.
    ("{% for m in messages %}{{ m['content'] }}|{% endfor %}", "a\nb|"),
])
def test_request_parts_are_a_list_only_for_templates_that_loop_over_content(tmp_path, chat_tokenizer, template,
                                                                           want):
    d = _with_template(tmp_path, chat_tokenizer, template)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert render_chat(str(d), json.dumps(body)) == want


def test_a_template_that_loops_over_content_gets_a_string_as_one_part(tmp_path, chat_tokenizer):
    d = _with_template(tmp_path, chat_tokenizer,
                       "{% for m in messages %}{% for p in m['content'] %}<{{ p['text'] }}>{% endfor %}{% endfor %}")
    assert render_chat(str(d), json.dumps({"messages": [{"role": "user", "content": "ab"}]})) == "<ab>"
    bad = _with_template(tmp_path / "bad", chat_tokenizer, "{% for m in messages %}")
    with pytest.raises(flexh2o.Error, match="chat template: .*endfor"):
        render_chat(str(bad), json.dumps({"messages": [{"role": "user", "content": "ab"}]}))


def test_template_files_take_priority_over_the_config_as_in_transformers(tmp_path, chat_tokenizer):
    # transformers 5 (tokenization_utils_base: "independent chat template file(s) ... take priority"):
    # the config's template was used here while transformers used the file.
    body = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False}
    d = _with_template(tmp_path, chat_tokenizer, "CONFIG{{ messages[0].content }}")
    assert ChatTemplate.from_dir(d).render_body(body) == "CONFIGhi"
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("TOOLS")
    with pytest.raises(flexh2o.Error, match="chat templates tool_use and no .*chat_template.jinja"):
        ChatTemplate.from_dir(d)
    (d / "chat_template.jinja").write_text("FILE{{ messages[0].content }}")
    assert ChatTemplate.from_dir(d).render_body(body) == "FILEhi"


def test_no_template_says_so(llms):
    with pytest.raises(flexh2o.Error, match='no chat template: .*tokenizer_config.json has no "chat_template"'):
        llms["llama"].apply_chat_template([{"role": "user", "content": "hi"}])


def test_generate_chat_hook(chat_tokenizer):
    # What `python -m flexh2o generate` installs as GenerateArgs::render_chat.
    body = {"model": "m", "messages": CASES[0][1], "max_tokens": 4}
    assert render_chat(str(chat_tokenizer), json.dumps(body)) == CASES[0][3]
    with pytest.raises(flexh2o.Error, match='"messages" array'):
        render_chat(str(chat_tokenizer), json.dumps({"prompt": "x"}))
    with pytest.raises(flexh2o.Error, match="no chat template"):
        render_chat("", json.dumps(body))


def test_python_front_end_renders_batch_chat_lines(tmp_path, chat_tokenizer, chat_llm):
    # A /v1/chat/completions line of an OpenAI Batch file: `python -m flexh2o generate` renders
    # the messages with the template (the binary refuses, naming the Python front end); the
    # prompt is the rendered text tokenized without BOS/EOS.
    messages = CASES[1][1]
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0}}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(line) + "\n")
    args = ["generate", "-m", TINY["llama"], "--tokenizer", chat_tokenizer, "--input", inp, "--output", out,
            "--quiet", "--device", "cpu", "--progress", "never"]
    r = run_module(args)
    assert r.returncode == 0, r.stderr
    body = json.loads(out.read_text())["response"]["body"]
    ids = chat_llm.encode(chat_llm.apply_chat_template(messages), add_special=False)
    (want,) = chat_llm.generate([ids], max_new_tokens=6)
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["choices"][0]["message"]["content"] == want.text
    out.unlink()
    r = run_binary(args)
    assert r.returncode == 1 and "the flexh2o binary cannot render chat templates" in r.stderr


def test_flexh2o_lines_with_messages_are_chats(tmp_path, chat_tokenizer, chat_llm):
    # A flexh2o line {"messages": [...]} is rendered like a Batch chat line (its text is
    # tokenized without BOS/EOS); the binary refuses such a line, naming the Python front end,
    # and still runs the others.
    messages = CASES[0][1]
    lines = [{"id": "chat", "messages": messages, "max_new_tokens": 5},
             {"id": "plain", "prompt": "In the beginning", "max_new_tokens": 3}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    args = ["generate", "-m", TINY["llama"], "--tokenizer", chat_tokenizer, "--input", inp, "--output", out,
            "--quiet", "--device", "cpu", "--progress", "never", "--greedy"]
    r = run_module(args)
    assert r.returncode == 0, r.stderr
    got = [json.loads(l) for l in out.read_text().splitlines()]
    ids = chat_llm.encode(chat_llm.apply_chat_template(messages), add_special=False)
    (want,) = chat_llm.generate([ids], max_new_tokens=5)
    assert got[0]["id"] == "chat" and got[0]["text"] == want.text and got[0]["token_ids"] == want.token_ids
    (plain,) = chat_llm.generate(["In the beginning"], max_new_tokens=3)
    assert got[1]["text"] == plain.text
    out.unlink()
    r = run_binary(args)
    assert r.returncode == 1, r.stderr
    got = [json.loads(l) for l in out.read_text().splitlines()]
    assert "the flexh2o binary cannot render chat templates" in got[0]["error"] and got[1]["text"] == plain.text


def test_chat_encodes_the_rendered_text_without_adding_bos(tmp_path, chat_tokenizer, chat_llm):
    # One BOS (the template's), as a Batch chat line of `python -m flexh2o generate` gets.
    messages = CASES[1][1]
    (got,) = chat_llm.chat(messages, max_new_tokens=6)
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": messages, "max_tokens": 6, "temperature": 0}}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(line) + "\n")
    r = run_module(["generate", "-m", TINY["llama"], "--tokenizer", chat_tokenizer, "--input", inp, "--output", out,
                    "--quiet", "--device", "cpu", "--progress", "never"])
    assert r.returncode == 0, r.stderr
    body = json.loads(out.read_text())["response"]["body"]
    assert got.text == body["choices"][0]["message"]["content"]
    text = chat_llm.apply_chat_template(messages)
    assert got == chat_llm.generate(chat_llm.encode(text, add_special=False), max_new_tokens=6)[0]
    assert chat_llm.last_report["prompt_tokens"] == body["usage"]["prompt_tokens"] == len(chat_llm.encode(text)) - 1
    # Several conversations, generate()'s arguments, and what is not a conversation.
    two = chat_llm.chat([messages, CASES[0][1]], max_new_tokens=6, logprobs=True)
    assert [c.token_ids for c in two][:1] == [got.token_ids] and all(c.logprobs for c in two)
    with pytest.raises(flexh2o.Error, match="messages must be a conversation"):
        chat_llm.chat("hi")


def test_a_failing_template_is_one_line_naming_the_python_error(tmp_path, chat_tokenizer):
    # The template's own code fails (str + int): flexh2o.Error with the exception's type
    # and message, and a Batch line's error holds just that (no "At:" Python stack).
    d = _with_template(tmp_path, chat_tokenizer,
                       "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + 1 }}{% endfor %}")
    messages = [{"role": "user", "content": "hi"}]
    want = 'chat template: TypeError: can only concatenate str (not "int") to str'
    with pytest.raises(flexh2o.Error, match=want.replace("(", r"\(").replace(")", r"\)")):
        flexh2o.LLM(str(TINY["llama"]), tokenizer=str(d), device="cpu").apply_chat_template(messages)
    line = {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": messages, "max_tokens": 2}}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(line) + "\n")
    r = run_module(["generate", "-m", TINY["llama"], "--tokenizer", d, "--input", inp, "--output", out, "--quiet",
                    "--device", "cpu", "--progress", "never"])
    assert r.returncode == 1, r.stderr
    message = json.loads(out.read_text())["response"]["body"]["error"]["message"]
    assert message == f"rendering the chat template failed: {d / 'tokenizer_config.json'}: {want}", message
