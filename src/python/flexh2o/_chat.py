"""Chat templates rendered the way Hugging Face transformers renders them
(`PreTrainedTokenizerBase.apply_chat_template`): chat_template.jinja when it exists (template
files take priority, as there), else tokenizer_config.json's (a string, or a list of {name,
template} of which "default" is used), compiled in a jinja2 ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, the loopcontrols extension, the `tojson` filter, `raise_exception`
and `strftime_now`, and rendered with the special-token strings (bos_token, eos_token, ...), add_generation_prompt and the caller's
variables, after transformers' normalisation of the messages (keys whose value is None dropped,
reasoning aliased); continue_final_message cuts the text where the last message ends, as there."""

import json
from datetime import datetime
from pathlib import Path

from ._flexh2o import Error

# Appended to the text to continue (continue_final_message), found again in the rendered text
# and cut there, as transformers does: whatever the template writes after the message goes.
_CONTINUE_TAG = "FLEXH2O_CONTINUE_FINAL_MESSAGE "
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# The names a message's reasoning goes by; transformers gives a template all of them.
_REASONING = ("reasoning_content", "thinking", "reasoning")


def _as_transformers_sees(messages) -> list:
    """The messages as transformers 5 hands them to a template: each a dict, its keys whose value
    is None dropped (content=None of an assistant turn with tool calls), and its reasoning, under
    any of _REASONING, also as "thinking" and "reasoning_content"."""
    if isinstance(messages, (str, bytes, dict)) or not hasattr(messages, "__iter__"):
        raise Error(f"messages must be a list of {{\"role\", \"content\"}} dicts, got {messages!r:.60}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise Error(f"message {i} must be a dict, got {m!r:.60}")
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _tag_final_message(messages, source: str):
    """(messages with _CONTINUE_TAG after the text of the last message, that text): the last
    text part of a content list, else the content string (transformers' rule)."""
    if not messages:
        raise Error("continue_final_message needs a conversation to continue")
    if "content" not in source:
        raise Error("continue_final_message: this chat template never reads a message's content")
    last = dict(messages[-1])
    content = last.get("content")
    if isinstance(content, str):
        final = content
        last["content"] = content + _CONTINUE_TAG
    elif isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        for p in reversed(parts):
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                final = p["text"]
                p["text"] = final + _CONTINUE_TAG
                break
        else:
            raise Error("continue_final_message: the last message has no text to continue")
        last["content"] = parts
    else:
        raise Error("continue_final_message: the last message has no \"content\" to continue")
    return messages[:-1] + [last], final


def _cut_after_final(text: str, final: str) -> str:
    """The rendered text up to the end of the tagged message (its trailing space kept when the
    template kept the tag's; else cut where the template trimmed)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise Error("continue_final_message: the chat template does not write the last message's text as "
                    "given, so there is no place to continue it")
    at = text.rindex(tag)
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def _token_text(tok):
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        # {% generation %}...{% endgeneration %} marks the assistant's tokens for transformers'
        # return_assistant_tokens_mask; rendering the text, it only outputs its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _loops_over_content(source: str) -> bool:
    """Whether the template loops over a message's content itself ({% for part in
    message['content'] %}, directly or through a variable set from it), as multimodal-aware
    templates (Gemma 3, Llama 3.2 Vision, Qwen2-VL) do: such a template is given a request's text
    parts as a list; another is given them joined (the distinction vLLM's chat content format
    draws)."""
    from jinja2 import nodes

    def content_of(n) -> bool:
        while isinstance(n, (nodes.Filter, nodes.Test)) or (isinstance(n, nodes.Getitem) and
                                                             isinstance(n.arg, nodes.Slice)):
            if n.node is None:
                return False
            n = n.node
        if isinstance(n, nodes.Getattr):
            return n.attr == "content"
        return isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Const) and n.arg.value == "content"

    ast = _environment().parse(source)
    aliases = {a.target.name for a in ast.find_all(nodes.Assign)
               if isinstance(a.target, nodes.Name) and content_of(a.node)}
    for loop in ast.find_all(nodes.For):
        it = loop.iter
        while isinstance(it, (nodes.Filter, nodes.Test)) and it.node is not None:
            it = it.node
        if content_of(it) or (isinstance(it, nodes.Name) and it.name in aliases):
            return True
    return False


def _compile(source: str):
    return _environment().from_string(source)


class ChatTemplate:
    """The chat template of a tokenizer directory and its special-token strings."""

    def __init__(self, source: str, special: dict, origin: str):
        self.source = source
        self.special = special
        self.origin = origin
        self._compiled = None
        self._loops = None  # _loops_over_content(source), once asked

    @classmethod
    def from_dir(cls, directory) -> "ChatTemplate":
        d = Path(directory) if directory else None
        if d is None or not d.is_dir():
            raise Error("no chat template: this model has no tokenizer directory (pass tokenizer=DIR / --tokenizer DIR)")
        cfg_path = d / "tokenizer_config.json"
        cfg = {}
        if cfg_path.is_file():
            try:
                cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise Error(f"{cfg_path}: cannot read the chat template: {e}") from None
        special = {}
        map_path = d / "special_tokens_map.json"
        if map_path.is_file():
            try:
                for k, v in json.loads(map_path.read_text(encoding="utf-8")).items():
                    special[k] = _token_text(v) if k != "additional_special_tokens" else [_token_text(t) for t in v]
            except (OSError, ValueError) as e:
                raise Error(f"{map_path}: {e}") from None
        for k in _SPECIAL:
            if cfg.get(k) is not None:
                special[k] = _token_text(cfg[k])
        if cfg.get("additional_special_tokens") is not None:
            special["additional_special_tokens"] = [_token_text(t) for t in cfg["additional_special_tokens"]]
        # Template files take priority over tokenizer_config.json's entry, as in transformers:
        # chat_template.jinja is the default, additional_chat_templates/NAME.jinja the named ones.
        files = {}
        if (d / "chat_template.jinja").is_file():
            files["default"] = d / "chat_template.jinja"
        if (d / "additional_chat_templates").is_dir():
            for f in sorted((d / "additional_chat_templates").glob("*.jinja")):
                files.setdefault(f.name[:-len(".jinja")], f)
        if files:
            if "default" not in files:
                raise Error(f"{d / 'additional_chat_templates'}: chat templates {', '.join(files)} and no "
                            f"{d / 'chat_template.jinja'}: none of them is the default")
            origin = str(files["default"])
            try:
                tmpl = files["default"].read_text(encoding="utf-8")
            except (OSError, ValueError) as e:
                raise Error(f"{origin}: cannot read the chat template: {e}") from None
        else:
            tmpl = cfg.get("chat_template")
            origin = str(cfg_path)
        if tmpl is None:
            raise Error(f"no chat template: {cfg_path} has no \"chat_template\" (and there is no "
                        f"{d / 'chat_template.jinja'}); this model is not a chat model")
        if isinstance(tmpl, list):
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            if "default" not in named:
                raise Error(f"{origin}: \"chat_template\" is a list without a \"default\" entry "
                            f"(names: {', '.join(str(n) for n in named)})")
            tmpl = named["default"]
        if not isinstance(tmpl, str):
            raise Error(f"{origin}: \"chat_template\" must be a string or a list of {{name, template}}, "
                        f"got {type(tmpl).__name__}")
        return cls(tmpl, special, origin)

    def render_body(self, body: dict) -> str:
        """A chat request's body (a Batch line, a server request, a flexh2o line; checked by the
        engine) rendered as vLLM renders it: its messages (render_request) with its
        add_generation_prompt (default true), continue_final_message (default false) and
        chat_template_kwargs, which may set those two too (vLLM merges them over the body's);
        null is absent."""
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            raise Error("a chat request needs a \"messages\" array")
        kwargs = {k: v for k, v in (body.get("chat_template_kwargs") or {}).items() if v is not None}
        flags = {k: kwargs.pop(k, body.get(k)) for k in ("add_generation_prompt", "continue_final_message")}
        return self.render_request(messages, add_generation_prompt=flags["add_generation_prompt"] is not False,
                                   continue_final_message=flags["continue_final_message"] is True,
                                   template_kwargs=kwargs)

    def render_request(self, messages, add_generation_prompt: bool = True, continue_final_message: bool = False,
                       template_kwargs=None) -> str:
        """An OpenAI request's messages (a Batch line, a server request; checked by the engine,
        text parts left as lists), as vLLM gives them to a template: for one that loops over
        content itself (_loops_over_content) every content a list of parts (a string one text
        part); for another every content a string (parts' texts joined by newlines); null
        content is empty text, and a part that is not a text part is an error, as the engine
        checks Batch lines. Then render()ed."""
        import jinja2
        if self._loops is None:
            try:
                self._loops = _loops_over_content(self.source)
            except jinja2.exceptions.TemplateError as e:
                raise Error(f"{self.origin}: chat template: {e}") from None
        def as_format(i, m):
            if not isinstance(m, dict):
                return m
            content = m.get("content")
            if content is None:
                content = m = dict(m, content="")
            if isinstance(content, list):
                for k, p in enumerate(content):
                    if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                        raise Error(f"message {i}: content[{k}] must be a text part "
                                    f"({{\"type\": \"text\", \"text\": ...}}), got {p!r:.60}")
            if self._loops and isinstance(content, str):
                return dict(m, content=[{"type": "text", "text": content}])
            if not self._loops and isinstance(content, list):
                return dict(m, content="\n".join(p["text"] for p in content))
            return m
        return self.render([as_format(i, m) for i, m in enumerate(messages)],
                           add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                           **(template_kwargs or {}))

    def render(self, messages, add_generation_prompt: bool = True, continue_final_message: bool = False,
               **template_kwargs) -> str:
        """transformers' apply_chat_template(tokenize=False): template_kwargs are variables for the
        template (they override the special-token strings, as there); continue_final_message ends
        the text inside the last message, for the model to continue it."""
        import jinja2
        messages = _as_transformers_sees(messages)  # a bad message is the caller's error, not the template's
        if not isinstance(continue_final_message, bool):
            raise Error(f"continue_final_message must be True or False (the last message's content is "
                        f"continued), got {continue_final_message!r:.40}")
        if continue_final_message and add_generation_prompt:
            raise Error("continue_final_message and add_generation_prompt cannot both be true (the first continues "
                        "the last message, the second starts a new one)")
        for own in ("tools", "documents", "chat_template"):
            if own in template_kwargs:
                raise Error(f"chat template variables cannot set {own!r}" +
                            (": the model's own template renders" if own == "chat_template" else ""))
        final = None
        if continue_final_message:
            messages, final = _tag_final_message(messages, self.source)
        try:
            if self._compiled is None:
                self._compiled = _compile(self.source)
            text = self._compiled.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt,
                                         **{**self.special, **template_kwargs})
        except jinja2.exceptions.TemplateError as e:
            raise Error(f"{self.origin}: chat template: {e}") from None
        except Exception as e:  # the template's own code failed: 'x' + None, a missing key, ...
            raise Error(f"{self.origin}: chat template: {type(e).__name__}: {e}") from None
        return text if final is None else _cut_after_final(text, final)
