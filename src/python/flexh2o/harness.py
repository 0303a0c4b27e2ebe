# lm-evaluation-harness support as pure functions over plain lists and tuples: how lm-eval's
# string requests become token-id requests for flexh2o.LLM, rolling perplexity windows, generation
# kwargs, reordering for batching, and --model_args parsing. Imports neither lm_eval nor torch, so
# all of it is tested without them; lm_eval_adapter.py drives an LLM with it, and
# lm_eval_model.py is the lm_eval.api.model.LM subclass over that.
"""Request conventions, and where lm-eval's HFLM (0.4.x) and ``flexh2o eval-choice`` differ.

* BOS: every non-empty context gets the model's BOS id in front when its tokenizer adds BOS to
  text (``LLM.encode(text)``: OPT's and LLaMA's do, SmolLM2's does not), as HFLM does by default
  and as ``eval-choice`` does. A context whose text already starts with the BOS token gets no
  second one (HFLM's ``has_bos_prefix``; eval-choice: whose ids start with BOS).
  ``add_bos_token=true`` / ``false`` in --model_args forces BOS on / off, as HFLM's does.
* Trailing whitespace of a context moves to the continuation. HFLM moves all of it
  (``str.rstrip``: spaces, newlines, tabs, Unicode spaces); so do we and eval-choice.
* The continuation's ids are ``encode(context + continuation)[len(encode(context)):]``, HFLM's
  split, even when a BPE merge crosses the boundary; eval-choice's too.
* Empty context: the context is ``[prefix]`` (BOS, else EOS, or --model_args prefix_token_id),
  and the continuation is encoded alone; if its first id is the prefix, that id is the context.
* Too long: ``context + continuation`` is cut from the left to ``max_length + 1`` ids (the last
  id is never fed). A continuation of more than ``max_length`` ids is refused, as HFLM refuses it.
* Rolling log-likelihood (perplexity tasks): the text is encoded without special tokens and
  scored in windows of ``max_length`` predictions, the first conditioned on ``[prefix]``: that is
  ``flexh2o eval-ppl``'s ``BOS + text``. (HFLM 0.4.13 with a BOS-adding tokenizer also scores the
  text's own BOS after the prefix; we do not.)
* Generation: the prompt is BOS + context cut from the left to ``max_length - max_gen_toks``;
  the text is ``decode`` of the generated ids cut before the earliest 'until' string (or the EOS
  text). HFLM stops generating at a stop string; we cut afterwards: the same text, more tokens
  computed. Sampling uses seed + the request's position in its LLM call (LLM.generate), so a
  sampled text depends on the batching; greedy does not.
* KV policies: a log-likelihood request's context is prefilled and the policy's ratios are
  fractions of that context, as in eval-choice (eviction follows the prefill's attention, so a
  continuation's first token sees the whole context). ``streaming=true`` in --model_args reads
  each request a token a step instead, ratios of all its tokens, as ``eval-choice --streaming``.
  Rolling windows whose context is one token go through LLM.loglikelihood_rolling (with a KV
  policy one token per step, ratios being fractions of the tokens scored, as in eval-ppl; with
  the full cache many tokens a step, the same numbers); a last window with a longer context is a
  log-likelihood request.
* acc, acc_norm (per character of the choice) and acc_bytes (per UTF-8 byte) are lm-eval's
  numbers in both; eval-choice also reports acc_norm_token (per token).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence, TypeVar

Ids = list[int]
T = TypeVar("T")


class RequestError(ValueError):
    """A request that cannot be scored as given (the message says which and why)."""


# ---------------------------------------------------------------------------------------------
# Encoding (context, continuation) pairs


@dataclass(frozen=True)
class Vocab:
    """What request encoding needs from a model: ``encode`` maps text to ids WITHOUT special
    tokens; ``bos_id`` goes before every non-empty context (None: nothing does); ``prefix_id``
    is the context of an empty-context request and of the first rolling window."""

    encode: Callable[[str], Ids]
    bos_id: int | None
    prefix_id: int | None


def move_trailing_whitespace(context: str, continuation: str) -> tuple[str, str]:
    """('Q: ', 'A') -> ('Q:', ' A'): all trailing whitespace of the context (str.rstrip)."""
    kept = context.rstrip()
    return kept, context[len(kept):] + continuation


def encode_pair(context: str, continuation: str, vocab: Vocab) -> tuple[Ids, Ids]:
    """lm-eval's (context, continuation) strings -> (context ids, continuation ids)."""
    if context == "":
        cont = list(vocab.encode(continuation))
        if vocab.prefix_id is None:
            raise RequestError("empty context, and the model has neither a BOS nor an EOS token to stand for it "
                               "(give prefix_token_id in --model_args)")
        if cont[:1] == [vocab.prefix_id]:
            ctx, cont = cont[:1], cont[1:]
        else:
            ctx = [vocab.prefix_id]
    else:
        text, cont_text = move_trailing_whitespace(context, continuation)
        ctx_enc = list(vocab.encode(text))
        whole = list(vocab.encode(text + cont_text))
        cont = whole[len(ctx_enc):]
        bos_given = vocab.bos_id is None or ctx_enc[:1] == [vocab.bos_id]  # none wanted, or in the text
        ctx = ctx_enc if bos_given else [vocab.bos_id] + ctx_enc
        if not ctx:  # a whitespace-only context and no BOS: condition on the prefix, as for ""
            if vocab.prefix_id is None:
                raise RequestError(f"context {context!r} encodes to no tokens and the model has no BOS/EOS token")
            ctx = [vocab.prefix_id]
    if not cont:
        raise RequestError(f"continuation {continuation!r} (after context {context[-40:]!r}) encodes to no tokens")
    return ctx, cont


def truncate_left(context: Ids, continuation: Ids, max_length: int) -> tuple[Ids, Ids]:
    """Keep the last max_length + 1 ids of context + continuation (the model reads max_length
    of them: the last id is only predicted), dropping from the context's left."""
    if len(continuation) > max_length:
        raise RequestError(f"continuation is {len(continuation)} tokens, more than max_length {max_length}")
    keep = max_length + 1 - len(continuation)
    return (context[-keep:] if len(context) > keep else list(context)), list(continuation)


# ---------------------------------------------------------------------------------------------
# Rolling windows (loglikelihood_rolling)


def rolling_windows(tokens: Sequence[int], prefix_id: int, max_length: int,
                    context_len: int = 1) -> list[tuple[Ids, Ids]]:
    """(inputs, predicted) pairs that predict every token exactly once, each reading at most
    max_length inputs. The first window reads [prefix] + tokens[:n-1] and predicts the first
    n = min(max_length, len) tokens. Each later window predicts up to max_length - context_len + 1
    new tokens and reads the max_length tokens just before its last prediction, so the last
    window has a full-length context even when it predicts few tokens. (lm-eval's
    get_rolling_token_windows contract.)"""
    if not 1 <= context_len <= max_length:
        raise RequestError(f"context_len must be in [1, max_length={max_length}], got {context_len}")
    toks = list(tokens)
    if not toks:
        return []
    first = min(max_length, len(toks))
    out = [([prefix_id] + toks[:first - 1], toks[:first])]
    done, stride = first, max_length - context_len + 1
    while done < len(toks):
        end = min(done + stride, len(toks))
        out.append((toks[end - 1 - max_length:end - 1], toks[done:end]))
        done = end
    return out


def disjoint(window: tuple[Ids, Ids]) -> tuple[Ids, Ids]:
    """(inputs, predicted) -> (context, continuation) with nothing in both: the inputs before the
    first predicted token (lm-eval's make_disjoint_window)."""
    inputs, predicted = window
    return inputs[:len(inputs) - len(predicted) + 1], predicted


def rolling_requests(tokens: Sequence[int], prefix_id: int, max_length: int) -> list[tuple[Ids, Ids]]:
    """The (context, continuation) requests whose log-likelihoods sum to a text's rolling
    log-likelihood (windows with context_len 1, as HFLM uses). Every one but possibly the last
    has a one-token context."""
    return [disjoint(w) for w in rolling_windows(tokens, prefix_id, max_length)]


# ---------------------------------------------------------------------------------------------
# generate_until


@dataclass(frozen=True)
class GenSpec:
    """One generation setting (hashable: requests are grouped by it). temperature 0 is greedy."""

    until: tuple[str, ...]
    max_gen_toks: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    min_p: float = 0.0               # transformers' MinPLogitsWarper; 0 = off
    repetition_penalty: float = 1.0  # transformers' RepetitionPenaltyLogitsProcessor; 1 = off


_MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # by priority
_GEN_KEYS = {"until", "do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
             *_MAX_TOKEN_KEYS}


def parse_gen_kwargs(gen_kwargs: dict | None, default_max_gen_toks: int, default_seed: int = 0) -> GenSpec:
    """A task's generation kwargs -> GenSpec, with lm-eval's rules: greedy unless do_sample is
    true or (do_sample unset and) temperature > 0; do_sample=false forces greedy; do_sample=true
    without a temperature samples at 1.0 (Hugging Face's default); max_gen_toks and its aliases
    by lm-eval's priority; min_p and repetition_penalty as transformers applies them. Keys flexh2o
    cannot honour (num_beams, max_length, no_repeat_ngram_size, ...) raise RequestError rather than being silently ignored."""
    kw = {k: v for k, v in (gen_kwargs or {}).items() if v is not None}
    unknown = sorted(set(kw) - _GEN_KEYS)
    if unknown:
        raise RequestError(f"generation kwargs {unknown} are not supported by flexh2o "
                           f"(supported: {sorted(_GEN_KEYS)})")
    until = kw.get("until", [])
    until = [until] if isinstance(until, str) else list(until)
    if not all(isinstance(s, str) for s in until):
        raise RequestError(f"'until' must be a string or a list of strings, got {kw.get('until')!r}")
    max_toks = next((kw[k] for k in _MAX_TOKEN_KEYS if k in kw), default_max_gen_toks)
    max_toks = _as_int("max_gen_toks", max_toks)
    if max_toks < 1:
        raise RequestError(f"max_gen_toks must be >= 1, got {max_toks}")
    do_sample = kw.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        do_sample = _parse_bool("do_sample", do_sample)
    temperature = _as_float("temperature", kw.get("temperature", 0.0))
    if temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {temperature}")
    if do_sample is False:
        temperature = 0.0
    elif do_sample is True and "temperature" not in kw:
        temperature = 1.0
    min_p = _as_float("min_p", kw.get("min_p", 0.0))
    if not 0.0 <= min_p <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {min_p}")
    penalty = _as_float("repetition_penalty", kw.get("repetition_penalty", 1.0))
    if not penalty > 0.0:
        raise RequestError(f"repetition_penalty must be > 0 (1 = off), got {penalty}")
    return GenSpec(until=tuple(until), max_gen_toks=max_toks, temperature=temperature,
                   top_k=_as_int("top_k", kw.get("top_k", 0)), top_p=_as_float("top_p", kw.get("top_p", 1.0)),
                   seed=_as_int("seed", kw.get("seed", default_seed)), min_p=min_p, repetition_penalty=penalty)


def cut_at_stops(text: str, stops: Iterable[str]) -> str:
    """The text before the earliest occurrence of any non-empty stop string."""
    end = len(text)
    for s in stops:
        if s:
            i = text.find(s)
            if i != -1:
                end = min(end, i)
    return text[:end]


def encode_text(text: str, vocab: Vocab) -> Ids:
    """A text's ids as lm-eval's tok_encode gives them: BOS first where vocab.bos_id says (unless
    the text's own first token is BOS), then the text's tokens."""
    ids = list(vocab.encode(text))
    if vocab.bos_id is not None and ids[:1] != [vocab.bos_id]:
        ids = [vocab.bos_id] + ids
    return ids


def generation_prompt(context: str, vocab: Vocab, max_length: int, max_gen_toks: int) -> Ids:
    """Prompt ids for generation: BOS + context (the same BOS rule as encode_pair), cut from the
    left to max_length - max_gen_toks ids so that the generated tokens fit."""
    room = max_length - max_gen_toks
    if room < 1:
        raise RequestError(f"max_gen_toks {max_gen_toks} leaves no room for a prompt in max_length {max_length}")
    ids = encode_text(context, vocab)
    if not ids:
        if vocab.prefix_id is None:
            raise RequestError("empty generation context and the model has no BOS/EOS token")
        ids = [vocab.prefix_id]
    return ids[-room:]


# ---------------------------------------------------------------------------------------------
# Reordering and batching


def sort_order(keys: Sequence[Any]) -> list[int]:
    """Indices ordered by key (stable for equal keys)."""
    return sorted(range(len(keys)), key=lambda i: keys[i])


def restore(results: Sequence[T], order: Sequence[int]) -> list[T]:
    """Undo sort_order: results[j] belongs to the request at original index order[j]."""
    if len(results) != len(order):
        raise ValueError(f"{len(results)} results for {len(order)} requests")
    out: list[Any] = [None] * len(order)
    for j, i in enumerate(order):
        out[i] = results[j]
    return out


def chunks(seq: Sequence[T], size: int) -> list[list[T]]:
    """Consecutive slices of at most `size` items."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [list(seq[i:i + size]) for i in range(0, len(seq), size)]


def group_by(keys: Sequence[Hashable]) -> list[list[int]]:
    """Indices with equal keys, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return list(groups.values())


def loglik_schedule(requests: Sequence[tuple[Ids, Ids]]) -> tuple[list[tuple[Ids, Ids]], list[int]]:
    """Distinct requests, longest first (HFLM's order: context + continuation length descending,
    then the ids, so similar lengths share a batch and little is padded), and for each original
    request the index of its distinct request in that list."""
    distinct: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    firsts: list[tuple[Ids, Ids]] = []
    which: list[int] = []
    for ctx, cont in requests:
        key = (tuple(ctx), tuple(cont))
        if key not in distinct:
            distinct[key] = len(firsts)
            firsts.append((list(ctx), list(cont)))
        which.append(distinct[key])
    order = sort_order([(-(len(c) + len(k)), tuple(c) + tuple(k)) for c, k in firsts])
    rank = {d: j for j, d in enumerate(order)}
    return [firsts[d] for d in order], [rank[d] for d in which]


def merge_report(totals: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """Adds one LLM.last_report to running totals for lm-eval's results ("config"): the engine
    calls, the device, KV policy and dtype, the offloading policy, and the bytes moved per link
    summed over calls (offloaded runs only)."""
    out = dict(totals)
    out["engine_calls"] = out.get("engine_calls", 0) + 1
    if not report:
        return out
    for key in ("device_name", "kv_policy", "kv_dtype", "compress_weight"):
        if key in report:
            out[key] = report[key]
    off = report.get("offload")
    if off:
        out["offload_policy"] = off.get("policy")
        moved = dict(out.get("offload_bytes_moved", {}))
        for link, n in off.get("bytes_moved", {}).items():
            moved[link] = moved.get(link, 0) + n
        out["offload_bytes_moved"] = moved
    return out


# ---------------------------------------------------------------------------------------------
# --model_args


# Our own options; everything else goes to flexh2o.LLM as a flag (it raises TypeError on unknown).
ADAPTER_ARGS = ("pretrained", "tokenizer", "device", "flexh2o_device", "batch_size", "max_batch_size",
                "threads", "max_length", "max_gen_toks", "add_bos_token", "prefix_token_id", "seed", "chunk_size",
                "streaming")
LIST_FLAGS = ("percent",)
BOOL_FLAGS = ("cpu_cache_compute", "overlap", "sep_layer", "pin_weight", "verify_store", "trust_store",
              "compress_weight", "compress_cache", "allow_compress", "no_compress")  # "1"/"yes"/"on" accepted too
_INT_RE = re.compile(r"[+-]?\d+")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@dataclass
class ModelArgs:
    """--model_args split into flexh2o.LLM's arguments and this adapter's options."""

    model: str
    llm_kwargs: dict[str, Any]      # for flexh2o.LLM(model, **llm_kwargs)
    max_length: int | None = None   # None: the model's
    max_gen_toks: int = 256         # HFLM's default
    add_bos_token: bool | None = None  # None: as the tokenizer adds it
    prefix_token_id: int | None = None
    seed: int = 0
    chunk_size: int = 1024          # requests per LLM call (the LLM batches inside a call)
    streaming: bool = False         # log-likelihoods read a token a step (LLM.loglikelihood)


def parse_value(value: Any) -> Any:
    """A --model_args value as lm-eval leaves it (str, int, float, bool) -> a Python value:
    'true'/'false' -> bool, integers -> int, numbers -> float, other strings unchanged."""
    if not isinstance(value, str):
        return value
    s = value.strip()
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    if _INT_RE.fullmatch(s):
        return int(s)
    try:
        f = float(s)
    except ValueError:
        return value
    return f if math.isfinite(f) else value


def parse_list(key: str, value: Any) -> list[int | float]:
    """percent="0 100 100 0 100 0" (spaces: lm-eval splits --model_args at commas) or a list."""
    items = value.split() if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for item in items:
        v = parse_value(item)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RequestError(f"--model_args {key}: {item!r} in {value!r} is not a number "
                               f"(write the numbers separated by spaces, e.g. {key}=\"0 100 100 0 100 0\")")
        out.append(v)
    return out


def map_device(lm_eval_device: Any, flexh2o_device: Any = None) -> str:
    """flexh2o's --device from lm-eval's: 'cpu' -> cpu; 'cuda', 'cuda:0' (lm-eval's default even
    when --device is not given) -> auto (the GPU when one is usable, else the CPU with the reason
    on stderr); None/'auto' -> auto. flexh2o_device= in --model_args (cpu|cuda|auto) wins, so
    cuda can be required strictly."""
    if flexh2o_device is not None:
        d = str(flexh2o_device)
        if d not in ("cpu", "cuda", "auto"):
            raise RequestError(f"--model_args flexh2o_device must be cpu, cuda or auto, got {d!r}")
        return d
    if lm_eval_device is None:
        return "auto"
    d = str(lm_eval_device)
    if d in ("cpu", "auto"):
        return d
    if d == "cuda" or d == "cuda:0":
        return "auto"
    raise RequestError(f"--device {d!r}: flexh2o runs on 'cpu' or one GPU ('cuda' / 'cuda:0')")


def parse_batch_size(batch_size: Any, max_batch_size: Any = None) -> int | None:
    """lm-eval's --batch_size (1, '4', 'auto', 'auto:N') -> LLM batch_size (None: the LLM's
    default, or max_batch_size when given with auto)."""
    if batch_size is None:
        return None
    if isinstance(batch_size, str) and batch_size.strip().startswith("auto"):
        return None if max_batch_size is None else _as_int("max_batch_size", max_batch_size)
    b = _as_int("batch_size", batch_size)
    if b < 1:
        raise RequestError(f"batch_size must be >= 1, got {batch_size!r}")
    return b


def parse_model_args(args: dict[str, Any]) -> ModelArgs:
    """lm-eval's keyword arguments for the model (--model_args plus batch_size/device) ->
    ModelArgs. pretrained= (or model=) is the model directory, hub id or preset."""
    a = dict(args)
    model = a.pop("pretrained", None) or a.pop("model", None)
    if not model:
        raise RequestError("--model_args needs pretrained=MODEL_DIR (a model directory, hub id or preset)")
    kwargs: dict[str, Any] = {"device": map_device(a.pop("device", None), a.pop("flexh2o_device", None))}
    batch = parse_batch_size(a.pop("batch_size", None), a.pop("max_batch_size", None))
    if batch is not None:
        kwargs["batch_size"] = batch
    for key in ("tokenizer", "threads"):
        if a.get(key) is not None:
            kwargs[key] = a.pop(key) if key == "tokenizer" else _as_int(key, a.pop(key))
        a.pop(key, None)
    out = ModelArgs(model=str(model), llm_kwargs=kwargs)
    if a.get("max_length") is not None:
        out.max_length = _as_int("max_length", a["max_length"])
    if a.get("max_gen_toks") is not None:
        out.max_gen_toks = _as_int("max_gen_toks", a["max_gen_toks"])
    if a.get("add_bos_token") is not None:
        out.add_bos_token = _parse_bool("add_bos_token", a["add_bos_token"])
    if a.get("prefix_token_id") is not None:
        out.prefix_token_id = _as_int("prefix_token_id", a["prefix_token_id"])
    if a.get("seed") is not None:
        out.seed = _as_int("seed", a["seed"])
    if a.get("chunk_size") is not None:
        out.chunk_size = _as_int("chunk_size", a["chunk_size"])
    if a.get("streaming") is not None:
        out.streaming = _parse_bool("streaming", a["streaming"])
    for key in ("max_length", "max_gen_toks", "add_bos_token", "prefix_token_id", "seed", "chunk_size", "streaming"):
        a.pop(key, None)
    for key, value in a.items():
        if key in LIST_FLAGS:
            kwargs[key] = parse_list(key, value)
        elif key in BOOL_FLAGS:
            kwargs[key] = _parse_bool(key, value)
        else:
            kwargs[key] = parse_value(value)
    return out


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise RequestError(f"{key} must be true or false, got {value!r}")


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise RequestError(f"{key} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value)
    raise RequestError(f"{key} must be an integer, got {value!r}")


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise RequestError(f"{key} must be a number, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise RequestError(f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(f):
        raise RequestError(f"{key} must be finite, got {value!r}")
    return f
