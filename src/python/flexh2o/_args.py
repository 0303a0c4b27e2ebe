"""flexh2o.LLM's arguments turned into what the engine's bindings take, or flexh2o.Error naming
the argument and what to pass (instead of pybind11's "incompatible function arguments" dump or a
silent int() truncation). Ranges the engine checks itself (temperature >= 0, token ids inside
the vocabulary, ...) are left to it; only values that could not reach it are refused here."""

import numbers
from typing import List, Optional, Union

from ._flexh2o import Error

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
MAX_TOP_LOGPROBS = 20  # engine/sampler.h kMaxTopLogprobs


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def integer(name: str, v, lo: Optional[int] = None, hi: Optional[int] = None) -> int:
    """v as an int: an int, or a float with an integral value (3.0); never a bool or 3.7."""
    if _is_int(v):
        n = int(v)
    elif isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v).is_integer():
        n = int(v)
    else:
        raise Error(f"{name} must be an integer, got {v!r}")
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        raise Error(f"{name} must be in [{_bound(lo)}, {_bound(hi)}], got {n}")
    return n


def _bound(n) -> str:
    names = {INT32_MIN: "-2**31", INT32_MAX: "2**31 - 1", INT64_MIN: "-2**63", INT64_MAX: "2**63 - 1"}
    return names.get(n, str(n))


def number(name: str, v) -> float:
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    raise Error(f"{name} must be a number, got {v!r}")


def seed(v) -> int:
    """Any integer, taken modulo 2**64 (-1 is 2**64 - 1, as a Batch line's int64 seed)."""
    return integer("seed", v) % 2**64


def logprobs(v) -> int:
    """None/False: off (-1); True: the chosen tokens' only (0); N in 0..20: and N alternatives."""
    if v is None or v is False:
        return -1
    if v is True:
        return 0
    if not _is_int(v) or not 0 <= v <= MAX_TOP_LOGPROBS:
        raise Error(f"logprobs must be None, False, True or an integer in [0, {MAX_TOP_LOGPROBS}] (the alternatives "
                    f"per token), got {v!r}")
    return int(v)


def text(what: str, s) -> str:
    """s, which must be a str that UTF-8 can encode (a lone surrogate such as '\\ud800' cannot)."""
    if not isinstance(s, str):
        raise Error(f"{what} must be a string, got {type(s).__name__}")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Error(f"{what} is not valid Unicode text: {s[e.start:e.end]!r} at index {e.start} ({e.reason}); "
                    "it cannot be encoded as UTF-8") from None
    return s


def ids(what: str, seq, vocab_size: Optional[int] = None) -> List[int]:
    """A sequence of token ids as ints. Strings are refused (encode them with LLM.encode); an id
    past int32 is refused here, others outside the vocabulary by the engine."""
    if isinstance(seq, (str, bytes, bytearray)):
        raise Error(f"{what} must be a list of token ids, got {type(seq).__name__} {_short(seq)} "
                    "(encode text with llm.encode(...))")
    try:
        items = list(seq)
    except TypeError:
        raise Error(f"{what} must be a list of token ids, got {_short(seq)}") from None
    for t in items:
        if not _is_int(t):
            raise Error(f"{what} must be a list of token ids (ints), got the item {_short(t)}")
        if not INT32_MIN <= t <= INT32_MAX:  # the engine's int32; it checks the vocabulary itself
            bound = f" [0, {vocab_size})" if vocab_size is not None else ""
            raise Error(f"{what}: token id {t} is outside the vocabulary{bound}")
    return [int(t) for t in items]


def prompts(p, vocab_size: int) -> List[Union[str, List[int]]]:
    """generate()'s prompts: a string, one prompt's ids (a flat list of ints), or a list of
    strings and id lists."""
    if isinstance(p, str):
        return [text("prompt 0", p)]
    if isinstance(p, (bytes, bytearray)):
        raise Error("prompts must be text or token ids, got bytes (decode them to str first)")
    try:
        items = list(p)
    except TypeError:
        raise Error(f"prompts must be a string, a list of token ids or a list of those, got {_short(p)}") from None
    if items and all(_is_int(t) for t in items):
        return [ids("prompt 0", items, vocab_size)]
    out = []
    for i, x in enumerate(items):
        if isinstance(x, str):
            out.append(text(f"prompt {i}", x))
        elif _is_int(x):
            raise Error(f"prompts mixes token ids with prompts (item {i} is {x!r}): give one prompt's ids as a flat "
                        "list, or several prompts as a list of strings and id lists")
        else:
            out.append(ids(f"prompt {i}", x, vocab_size))
    return out


def sequences(name: str, v) -> list:
    """A list of token-id lists (one flat list of ids is refused: it would be read as one-token sequences)."""
    try:
        items = None if isinstance(v, (str, bytes, bytearray)) else list(v)
    except TypeError:
        items = None
    if items is None:
        raise Error(f"{name} must be a list of token-id lists, got {_short(v)}")
    if items and all(_is_int(t) for t in items):
        raise Error(f"{name} must be a list of token-id lists, got one flat list of ids (wrap it: [ids])")
    return items


def pairs(requests) -> list:
    """loglikelihood's requests: (context ids, continuation ids) pairs."""
    try:
        items = list(requests)
    except TypeError:
        raise Error(f"requests must be a list of (context ids, continuation ids) pairs, "
                    f"got {_short(requests)}") from None
    for i, r in enumerate(items):
        if isinstance(r, (str, bytes, bytearray)) or not hasattr(r, "__len__") or len(r) != 2:
            raise Error(f"request {i} must be a (context ids, continuation ids) pair, got {_short(r)}")
    return items


def logit_bias(v, vocab_size: int) -> list:
    """{token id: bias} -> [(id, bias)]; the engine checks the ids' range and the biases'."""
    if v is None:
        return []
    if not hasattr(v, "items"):
        raise Error(f"logit_bias must be a dict {{token id: bias}}, got {_short(v)}")
    for t in v:  # ids() would call the key "the item" of "a list"
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise Error(f"logit_bias keys must be token ids (ints), got the key {_short(t)}")
    return [(ids("logit_bias", [t], vocab_size)[0], number(f"logit_bias[{t!r}]", b)) for t, b in v.items()]


def stops(stop) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [text("stop", stop)]
    try:
        items = list(stop)
    except TypeError:
        raise Error(f"stop must be a string or a list of strings, got {_short(stop)}") from None
    return [text(f"stop[{i}]", s) for i, s in enumerate(items)]


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
