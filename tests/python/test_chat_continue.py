"""The chat template's variables beyond the messages, as transformers' apply_chat_template and
vLLM's request bodies take them: continue_final_message (the text ends inside the last message,
cut as transformers cuts it), add_generation_prompt false, and template variables
(chat_template_kwargs, e.g. enable_thinking), through LLM.apply_chat_template / LLM.chat, the
`generate` chat hook and Batch / flexh2o lines. tests/tools/check_chat_template.py checks
CONTINUE_CASES against transformers itself."""

import json

import pytest

import flexh2o
from conftest import TINY, run_binary, run_module
from flexh2o.__main__ import render_chat

# A template that keeps a message's spacing and reads enable_thinking (as Qwen3's does).
THINKING = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}{% if add_generation_prompt %}"
            "<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
            "{% endif %}")
HELLO = {"role": "user", "content": "Hello"}
# (name, template: None for the fixture's, messages, apply_chat_template keywords, what transformers renders)
CONTINUE_CASES = [
    ("continued through the template's trim and EOS", None,
     [HELLO, {"role": "assistant", "content": "Grace be "}],
     dict(add_generation_prompt=False, continue_final_message=True), "<s>\n[INST] Hello [/INST]\n Grace be "),
    ("continued where the template keeps the spacing", THINKING,
     [HELLO, {"role": "assistant", "content": "Grace be "}],
     dict(add_generation_prompt=False, continue_final_message=True), "<|user|>Hello<|end|>\n<|assistant|>Grace be "),
    ("a user message continued", THINKING, [HELLO],
     dict(add_generation_prompt=False, continue_final_message=True), "<|user|>Hello"),
    ("a template variable", THINKING, [HELLO],
     dict(enable_thinking=False), "<|user|>Hello<|end|>\n<|assistant|><think></think>"),
    ("a variable overrides a special token", None, [HELLO],
     dict(bos_token="<B>", add_generation_prompt=False), "<B>\n[INST] Hello [/INST]\n"),
]


def _dir(tmp_path, chat_tokenizer, template):
    if template is None:
        return chat_tokenizer
    d = tmp_path / "tok"
    d.mkdir()
    for f in chat_tokenizer.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("name, template, messages, kw, want", CONTINUE_CASES, ids=[c[0] for c in CONTINUE_CASES])
def test_renders_as_transformers(tmp_path, chat_tokenizer, name, template, messages, kw, want):
    d = _dir(tmp_path, chat_tokenizer, template)
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(d), device="cpu")
    assert llm.apply_chat_template(messages, **kw) == want
    # The same through a request body (the `generate` hook of Batch, flexh2o and server lines).
    body = {"messages": messages, "add_generation_prompt": kw.get("add_generation_prompt", True),
            "continue_final_message": kw.get("continue_final_message", False),
            "chat_template_kwargs": {k: v for k, v in kw.items()
                                     if k not in ("add_generation_prompt", "continue_final_message")}}
    assert render_chat(str(d), json.dumps(body)) == want


def test_continue_final_message_errors(tmp_path, chat_tokenizer):
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")
    conv = [HELLO, {"role": "assistant", "content": "Grace"}]
    with pytest.raises(flexh2o.Error, match="cannot both be true"):
        llm.apply_chat_template(conv, continue_final_message=True)  # add_generation_prompt's default is true
    with pytest.raises(flexh2o.Error, match='no "content" to continue'):
        llm.apply_chat_template([HELLO, {"role": "assistant", "content": None}], add_generation_prompt=False,
                                continue_final_message=True)
    drops = _dir(tmp_path, chat_tokenizer, "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}"
                                          "{% endfor %}")
    with pytest.raises(flexh2o.Error, match="does not write the last message's text as given"):
        render_chat(str(drops), json.dumps({"messages": conv, "add_generation_prompt": False,
                                            "continue_final_message": True}))
    with pytest.raises(flexh2o.Error, match="cannot set 'messages'"):
        llm.chat(conv, chat_template_kwargs={"messages": []})
    with pytest.raises(flexh2o.Error, match="chat_template_kwargs must be a dict"):
        llm.chat(conv, chat_template_kwargs=["x"])


def test_a_continued_batch_line_generates_from_the_cut_text(tmp_path, chat_tokenizer):
    # LLM.chat, a Batch chat line and a flexh2o line with the same parameters give the same tokens
    # from the same prompt; the binary (no templates) and a prompt line with them refuse.
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")
    conv = [HELLO, {"role": "assistant", "content": "In the beginning"}]
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    (want,) = llm.chat(conv, max_new_tokens=6, temperature=0, **extra)
    ids = llm.encode("<s>\n[INST] Hello [/INST]\n In the beginning", add_special=False)
    assert want == llm.generate([ids], max_new_tokens=6)[0]
    lines = [{"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "tiny", "messages": conv, "max_tokens": 6, "temperature": 0, "top_k": 5, **extra}}]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(l) + "\n" for l in lines))
    args = ["generate", "-m", TINY["llama"], "--tokenizer", chat_tokenizer, "--input", inp, "--output", out,
            "--quiet", "--device", "cpu", "--progress", "never"]
    r = run_module(args)
    assert r.returncode == 0, r.stderr
    body = json.loads(out.read_text())["response"]["body"]
    assert body["choices"][0]["message"]["content"] == want.text and body["usage"]["prompt_tokens"] == len(ids)
    flex = [{"id": "a", "messages": conv, "max_new_tokens": 6, "top_k": -1, **extra},
            {"id": "b", "prompt": "Hello", "continue_final_message": True}]
    inp.write_text("".join(json.dumps(l) + "\n" for l in flex))
    out.unlink()
    r = run_module(args + ["--greedy"])
    assert r.returncode == 1, r.stderr
    got = [json.loads(l) for l in out.read_text().splitlines()]
    assert got[0]["token_ids"] == want.token_ids
    assert got[1]["error"] == 'field "continue_final_message" applies to a chat template: it needs "messages"'


def test_flags_in_chat_template_kwargs_override_the_bodys(tmp_path, chat_tokenizer):
    # vLLM merges chat_template_kwargs over the request's own template parameters.
    conv = [HELLO, {"role": "assistant", "content": "Grace be "}]
    body = {"messages": conv, "chat_template_kwargs": {"add_generation_prompt": False, "continue_final_message": True}}
    assert render_chat(str(chat_tokenizer), json.dumps(body)) == CONTINUE_CASES[0][4]


def test_chat_renders_as_batch_lines_and_top_k_minus_one_is_off(chat_tokenizer):
    # LLM.chat joins a content list's text parts as a Batch line does (vLLM's LLM.chat too);
    # apply_chat_template passes them through, as transformers does.
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Who made"}, {"type": "text", "text": "light?"}]}]
    joined = [{"role": "user", "content": "Who made\nlight?"}]
    assert llm.chat(parts, max_new_tokens=4) == llm.chat(joined, max_new_tokens=4)
    assert '"type": "text"' in llm.apply_chat_template(parts)
    # top_k -1 is off, as vLLM's (and a Batch body's): the same draws as 0.
    sampled = dict(max_new_tokens=6, temperature=1.0, seed=3)
    assert llm.generate(["In the"], top_k=-1, **sampled) == llm.generate(["In the"], top_k=0, **sampled)
    with pytest.raises(flexh2o.Error, match="top_k"):
        llm.generate(["In the"], top_k=-2)
    with pytest.raises(flexh2o.Error, match="returns the text: encode it"):
        llm.apply_chat_template(joined, tokenize=True)
    with pytest.raises(flexh2o.Error, match="continue_final_message must be True or False"):
        llm.apply_chat_template(joined, add_generation_prompt=False, continue_final_message="reasoning_content")
    with pytest.raises(flexh2o.Error, match="cannot set 'chat_template'"):
        llm.chat(joined, chat_template_kwargs={"chat_template": "x"})


def test_chat_takes_the_flags_in_chat_template_kwargs_and_checks_parts(chat_tokenizer):
    # As vLLM's LLM.chat: the two flags in chat_template_kwargs override the arguments; a content
    # part that is not text is flexh2o.Error (a Batch line's error names it too); null content is "".
    llm = flexh2o.LLM(str(TINY["llama"]), tokenizer=str(chat_tokenizer), device="cpu")
    conv = [HELLO, {"role": "assistant", "content": "In the beginning"}]
    flags = {"add_generation_prompt": False, "continue_final_message": True}
    assert llm.chat(conv, max_new_tokens=4, chat_template_kwargs=flags) == llm.chat(conv, max_new_tokens=4, **flags)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}]
    with pytest.raises(flexh2o.Error, match=r"message 0: content\[1\] must be a text part"):
        llm.chat(parts)
    with_none = [HELLO, {"role": "assistant", "content": None}, {"role": "user", "content": "And?"}]
    with_empty = [HELLO, {"role": "assistant", "content": ""}, {"role": "user", "content": "And?"}]
    assert llm.chat(with_none, max_new_tokens=3) == llm.chat(with_empty, max_new_tokens=3)
