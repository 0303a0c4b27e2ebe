"""flexh2o.LLM: a model loaded once (weights memory-mapped) and run by the CLI's engine.

Keyword flags are the CLI's offloading / KV-cache / compression flags with underscores
(heavy_ratio=0.1 is --heavy-ratio 0.1, cpu_cache_compute=True is --cpu-cache-compute,
percent=[...] is --percent ...), parsed by the CLI's own flag registration: an unknown name
raises TypeError, a bad value flexh2o.Error with the CLI's message. generate / loglikelihood /
loglikelihood_rolling / score run with the GIL released; calls on one LLM run one at a time.

generation_config="auto" (the default) reads the model's generation_config.json as `flexh2o
generate` does (the same C++ reader): its temperature, top_k, top_p, min_p and repetition_penalty
become generate()'s defaults (LLM.generation_defaults; one line on stderr says which), and
generate()'s arguments override them; generation_config="none" ignores those values. Either way
its eos_token_id ends sequences, beside config.json's and the tokenizer's (LLM.eos_ids)."""

import json
import sys
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from . import _args, _env
from ._chat import ChatTemplate
from ._flexh2o import Error, Session


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: List[int]  # generated tokens only
    finish_reason: str  # "eos" | "length" | "stop"
    # With generate(logprobs=True or N): each token's log-probability under the model (nats,
    # before penalties and temperature), and for N > 0 the N most likely (id, logprob) at each step.
    logprobs: Optional[List[float]] = None
    top_logprobs: Optional[List[List[Tuple[int, float]]]] = None


def _flag(name, value):
    if isinstance(value, bool):
        return (name, ["true" if value else "false"], True)
    if isinstance(value, (list, tuple)):
        return (name, [_text(v) for v in value], False)
    return (name, [_text(value)], False)


def _text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


# generate()'s sampling defaults where the model's generation_config.json has no value (greedy).
_BUILTIN = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)


class LLM:
    def __init__(self, model: str, *, tokenizer: Optional[str] = None, device: str = "auto",
                 batch_size: Optional[int] = None, threads: Optional[int] = None, generation_config: str = "auto",
                 **flags):
        """batch_size: sequences run together (default 8). With offloading flags the batch is the
        policy's block (gpu_batch_size, default 4, x num_gpu_batches); batch_size given there is
        gpu_batch_size unless gpu_batch_size / num_gpu_batches / policy set the block."""
        flags = [_flag(k, v) for k, v in flags.items() if v is not None]
        if not isinstance(device, str):
            raise Error(f"device must be a string (\"auto\", \"cpu\", \"cuda\", \"cuda:N\"), got {device!r}")
        # Only the C types' ranges here: the engine says what it accepts (batch_size >= 1, ...).
        if batch_size is None:
            batch_size = 0  # not given: the engine's default (and an offloading policy's own block)
        else:
            batch_size = _args.integer("batch_size", batch_size, _args.INT64_MIN, _args.INT64_MAX)
            if batch_size < 1:
                raise Error(f"batch_size must be >= 1, got {batch_size}")
        threads = 0 if threads is None else _args.integer("threads", threads, _args.INT32_MIN, _args.INT32_MAX)
        tokenizer = "" if tokenizer is None else _args.text("tokenizer", str(tokenizer))
        self._s = Session(_args.text("model", str(model)), tokenizer, device, batch_size, threads, flags,
                          _env.configs_dir(), stderr_is_tty=_env.stderr_is_tty(),
                          generation_config=_args.text("generation_config", generation_config), **_env.hub_env())
        self._chat = None
        self._local = threading.local()  # each thread's last_report
        self._call_lock = threading.Lock()  # a call and the reading of its report, together
        self.name: str = self._s.name
        self.vocab_size: int = self._s.vocab_size
        self.max_length: int = self._s.max_length
        self.eos_id: Optional[int] = self._s.eos_id
        # Every id that ends a sequence: the tokenizer's, config.json's and generation_config.json's.
        self.eos_ids: List[int] = list(self._s.eos_ids)
        self.bos_id: Optional[int] = self._s.bos_id
        values, file = self._s.generation_config
        # top_k cut to an int, as the CLI does.
        self.generation_defaults: Dict[str, float] = {k: int(v) if k == "top_k" else v for k, v in values}
        if self.generation_defaults:
            taken = ", ".join(f"{k} {v:g}" for k, v in self.generation_defaults.items())
            print(f"flexh2o: sampling defaults from {file}: {taken} (generate()'s arguments override them; "
                  'generation_config="none" ignores the file)', file=sys.stderr)

    def encode(self, text: str, add_special: bool = True) -> List[int]:
        return self._s.encode(_args.text("text", text), bool(add_special))

    def decode(self, ids: Sequence[int]) -> str:
        return self._s.decode(_args.ids("ids", ids))

    def generate(self, prompts: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]], *,
                 max_new_tokens: int = 32, temperature: Optional[float] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, seed: int = 0, ignore_eos: bool = False,
                 stop: Union[str, Sequence[str], None] = None, min_p: Optional[float] = None,
                 repetition_penalty: Optional[float] = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, logprobs: Union[bool, int, None] = None,
                 logit_bias: Optional[Dict[int, float]] = None, continuous: bool = False) -> List[Completion]:
        """prompts: a string, one prompt's token ids (a flat list of ints), or a list of strings and
        id lists. Text prompts get BOS per the model's convention (as the CLI's "prompt"); id lists
        are used exactly. Request i samples with seed + i; seeds are taken modulo 2**64 (-1 is
        2**64 - 1, as in Batch files). Greedy when temperature is 0. temperature, top_k, top_p,
        min_p and repetition_penalty left None take generation_defaults' value (the model's
        generation_config.json), else greedy, 0 (off), 1.0, 0.0 and 1.0 (off). A sequence
        ends as soon as its text holds one of the `stop` strings (finish_reason "stop"; the text
        is cut before it, token_ids keep every generated token). min_p and repetition_penalty
        are transformers' (the penalty also applies when greedy), presence_penalty and
        frequency_penalty OpenAI's (over the generated tokens). logprobs=True fills the
        completions' logprobs (each chosen token's), logprobs=N (0..20) also top_logprobs (the N
        most likely tokens at each step); None or False: neither. logit_bias
        {token id: bias in [-100, 100]} is added to those logits after the penalties, greedy too
        (OpenAI's; -100 bans a token). continuous=True: continuous batching (`generate
        --continuous`): a prompt whose answer ends hands its batch slot to the next; the same
        results, in fewer steps when lengths vary. It needs a full cache: under a kv_policy (or a
        sliding-window cap) the calls run static batches, which stderr says once."""
        n_top = _args.logprobs(logprobs)
        given = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     repetition_penalty=repetition_penalty)
        sp = {k: v if v is not None else self.generation_defaults.get(k, _BUILTIN[k]) for k, v in given.items()}
        items = _args.prompts(prompts, self.vocab_size)
        num = _args.number
        out = self._run("generate", items, _args.integer("max_new_tokens", max_new_tokens, 0, _args.INT64_MAX),
                               num("temperature", sp["temperature"]),
                               _args.integer("top_k", sp["top_k"], -1, _args.INT32_MAX),
                               num("top_p", sp["top_p"]), _args.seed(seed), bool(ignore_eos), _args.stops(stop),
                               min_p=num("min_p", sp["min_p"]),
                               repetition_penalty=num("repetition_penalty", sp["repetition_penalty"]),
                               presence_penalty=num("presence_penalty", presence_penalty),
                               frequency_penalty=num("frequency_penalty", frequency_penalty), logprobs=n_top,
                               logit_bias=_args.logit_bias(logit_bias, self.vocab_size), continuous=bool(continuous))
        return [Completion(t.decode("utf-8", "replace"), list(ids), reason, list(lp) if n_top >= 0 else None,
                           [[(int(i), float(x)) for i, x in step] for step in top] if n_top > 0 else None)
                for t, ids, reason, lp, top in out]

    def loglikelihood(self, requests: Sequence[Tuple[Sequence[int], Sequence[int]]],
                      streaming: bool = False) -> List[Tuple[float, bool]]:
        """(sum of log p(continuation | context) in nats, whether every continuation token was
        the argmax) per (context ids, continuation ids). The context includes BOS if wanted.
        Token ids, not text: encode text with llm.encode(...). With a KV policy the context is
        prefilled with full attention and its ratios are fractions of the context; streaming=True
        reads each request a token a step from its first id instead, so the policy holds inside the
        context too, its ratios fractions of all the tokens read (H2O's accuracy protocol). With the
        full cache both give the same numbers."""
        reqs = [(_args.ids(f"request {i} context", c, self.vocab_size),
                 _args.ids(f"request {i} continuation", x, self.vocab_size))
                for i, (c, x) in enumerate(_args.pairs(requests))]
        if not isinstance(streaming, bool):
            raise TypeError(f"streaming must be a bool, got {type(streaming).__name__}")
        out = self._run("loglikelihood", reqs, streaming)
        return [(float(ll), bool(g)) for ll, g in out]

    def loglikelihood_rolling(self, ids: Sequence[Sequence[int]]) -> List[float]:
        """Per sequence: sum over t >= 1 of log p(ids[t] | ids[:t]) in nats. With a KV policy one
        token per step (so the policy holds at every step; ratio budgets are fractions of the
        tokens scored); with the full cache many tokens a step, which gives the same numbers."""
        seqs = [_args.ids(f"sequence {i}", s, self.vocab_size) for i, s in enumerate(_args.sequences("ids", ids))]
        out = self._run("loglikelihood_rolling", seqs)
        return list(out)

    def score(self, ids: Sequence[Sequence[int]], top: int = 0) -> List[List[Tuple[float, List[Tuple[int, float]]]]]:
        """Per sequence, for each token after the first: (log p(token | the tokens before) in
        nats, the `top` (0..20) most likely tokens there as [(id, log p)], most likely first):
        a prompt's log-probabilities, as an OpenAI completion with echo and logprobs gives them.
        The model's own numbers, as loglikelihood_rolling computes them."""
        seqs = [_args.ids(f"sequence {i}", s, self.vocab_size) for i, s in enumerate(_args.sequences("ids", ids))]
        top = _args.integer("top", top, 0, _args.MAX_TOP_LOGPROBS)
        out = self._run("score", seqs, top)
        return [[(float(lp), [(int(i), float(x)) for i, x in alts]) for lp, alts in s] for s in out]

    def chat(self, messages: Union[List[dict], List[List[dict]]], *, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: Optional[dict] = None,
             **generate_kwargs) -> List[Completion]:
        """generate() on chat conversations: `messages` is one conversation ([{"role", "content"},
        ...]) or a list of them, each rendered with the chat template as vLLM's LLM.chat renders
        it and a Batch chat line is (text parts of a content list joined by newlines unless the
        template loops over content; the generation prompt unless told otherwise;
        continue_final_message; chat_template_kwargs) and encoded without adding special tokens
        (a template writes its own BOS); one Completion per conversation. generate_kwargs are
        generate()'s."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise Error("messages must be a conversation (a non-empty list of {\"role\", \"content\"} dicts) "
                        f"or a list of conversations, got {messages!r:.60}")
        convs = [messages] if isinstance(messages[0], dict) else messages
        for i, c in enumerate(convs):
            if not isinstance(c, (list, tuple)) or not c:
                raise Error(f"conversation {i} must be a non-empty list of {{\"role\", \"content\"}} dicts, got {c!r:.60}")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise Error(f"chat_template_kwargs must be a dict, got {chat_template_kwargs!r:.60}")
        kwargs = dict(chat_template_kwargs or {})
        for own in ("messages", "tools", "documents"):
            if own in kwargs:
                raise Error(f"chat_template_kwargs cannot set {own!r}")
        # As vLLM merges them: the two flags given there override the arguments.
        add_generation_prompt = kwargs.pop("add_generation_prompt", add_generation_prompt)
        continue_final_message = kwargs.pop("continue_final_message", continue_final_message)
        if self._chat is None:
            self._chat = ChatTemplate.from_dir(self._s.tokenizer_dir)
        ids = [self.encode(self._chat.render_request(c, add_generation_prompt=add_generation_prompt,
                                                     continue_final_message=continue_final_message,
                                                     template_kwargs=kwargs), add_special=False)
               for c in convs]
        return self.generate(ids, **generate_kwargs)

    def _render_body(self, body: dict) -> str:
        """An OpenAI chat request's body as the server renders it (ChatTemplate.render_body)."""
        if self._chat is None:
            self._chat = ChatTemplate.from_dir(self._s.tokenizer_dir)
        return self._chat.render_body(body)

    def apply_chat_template(self, messages: List[dict], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, **template_kwargs) -> str:
        """The conversation as the model's chat template renders it (transformers' rules), the
        special tokens as text: a template that writes {{ bos_token }} starts with BOS's text, so
        encode it with add_special=False (encode(text) would add a second BOS); chat() does.
        continue_final_message (with add_generation_prompt=False): the text ends where the last
        message's does, for the model to continue it. template_kwargs: variables for the template
        (enable_thinking=False, ...)."""
        if "tokenize" in template_kwargs:
            raise Error("apply_chat_template returns the text: encode it with encode(text, add_special=False)")
        if self._chat is None:
            self._chat = ChatTemplate.from_dir(self._s.tokenizer_dir)
        return self._chat.render(messages, add_generation_prompt=add_generation_prompt,
                                 continue_final_message=continue_final_message, **template_kwargs)

    @property
    def last_report(self) -> Optional[dict]:
        """The run report of this thread's last generate / loglikelihood / loglikelihood_rolling /
        score call on this LLM (None before one, or after one that raised or had nothing to run):
        threads sharing an LLM each read their own."""
        return getattr(self._local, "report", None)

    def _run(self, method: str, *args, **kwargs):
        """self._s.<method>(...), its report kept as this thread's last_report (calls run one at a
        time anyway: the session serializes them)."""
        self._local.report = None
        with self._call_lock:
            out = getattr(self._s, method)(*args, **kwargs)
            text = self._s.last_report()
        self._local.report = json.loads(text) if text else None
        return out

    def __repr__(self):
        return f"flexh2o.LLM({self.name!r})"
