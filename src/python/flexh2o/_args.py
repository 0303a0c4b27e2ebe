"""flexh2o.LLM's arguments turned into what the engine's bindings take, or flexh2o.Error naming
the argument and what to pass (instead of pybind11's "incompatible function arguments" dump or a
silent int() truncation). Ranges the engine checks itself (temperature >= 0, token ids inside
the vocabulary, ...) are left to it; only values that could not reach it are refused here."""

from ._flexh2o import Error

MAX_TOP_LOGPROBS = 20  # engine/sampler.h kMaxTopLogprobs


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
