# Drives a flexh2o.LLM (or any object with its interface) through lm-evaluation-harness's three
# request types, on the pure functions of harness.py. No lm_eval import: lm_eval_model.py wraps
# this in an lm_eval.api.model.LM, and tests drive it with a fake LLM. Not thread-safe; one
# adapter per LLM. Log-likelihoods are natural logs, as lm-eval expects.
from __future__ import annotations

from typing import Any, Callable, Sequence

from . import harness as h

Progress = Callable[[int], None]  # called with the number of requests just finished


def _noop(_: int) -> None:
    pass


class HarnessAdapter:
    """lm-eval requests -> flexh2o.LLM calls, with the conventions in harness.py's docstring.

    llm: needs encode(text, add_special), decode(ids), loglikelihood(pairs),
    loglikelihood_rolling(ids_list), generate(prompt_ids, ...), max_length, bos_id, eos_id.
    chunk_size: requests handed to the LLM per call (it batches inside a call at its own block
    size; between calls the progress bar moves). streaming: log-likelihood requests are read a
    token a step from their first id (LLM.loglikelihood(..., streaming=True))."""

    def __init__(self, llm: Any, *, max_length: int | None = None, max_gen_toks: int = 256,
                 add_bos_token: bool | None = None, prefix_token_id: int | None = None, seed: int = 0,
                 chunk_size: int = 1024, streaming: bool = False):
        self.llm = llm
        self.streaming = streaming  # log-likelihoods a token a step (LLM.loglikelihood's streaming)
        model_max = int(llm.max_length)
        if max_length is not None and not 1 <= max_length <= model_max:
            raise h.RequestError(f"max_length {max_length} must be in [1, the model's {model_max}]")
        self.max_length = max_length or model_max
        if max_gen_toks < 1:
            raise h.RequestError(f"max_gen_toks must be >= 1, got {max_gen_toks}")
        self.max_gen_toks = max_gen_toks
        self.seed = seed
        if chunk_size < 1:
            raise h.RequestError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = chunk_size
        bos, eos = llm.bos_id, llm.eos_id
        prefix = prefix_token_id if prefix_token_id is not None else bos if bos is not None else eos
        if add_bos_token is None:  # HFLM's default (lm-eval 0.4.13): what the tokenizer adds to text
            with_, plain = list(llm.encode("a", add_special=True)), list(llm.encode("a", add_special=False))
            add_bos_token = bos is not None and with_[:1 + len(plain)] == [bos] + plain
        self.vocab = h.Vocab(encode=lambda text: list(llm.encode(text, add_special=False)),
                             bos_id=bos if add_bos_token else None, prefix_id=prefix)
        self.eos_text = llm.decode([eos]) if eos is not None else ""
        self.engine: dict[str, Any] = {}  # harness.merge_report over every LLM call

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self.llm, method)(*args, **kwargs)
        self.engine = h.merge_report(self.engine, getattr(self.llm, "last_report", None))
        return out

    # -- loglikelihood ---------------------------------------------------------------------------

    def encode_requests(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[h.Ids, h.Ids]]:
        """(context, continuation) strings -> token requests that fit max_length."""
        out = []
        for i, (context, continuation) in enumerate(pairs):
            try:
                out.append(h.truncate_left(*h.encode_pair(context, continuation, self.vocab), self.max_length))
            except h.RequestError as e:
                raise h.RequestError(f"loglikelihood request {i}: {e}") from None
        return out

    def loglikelihood(self, pairs: Sequence[tuple[str, str]], progress: Progress = _noop) -> list[tuple[float, bool]]:
        return self.loglikelihood_tokens(self.encode_requests(pairs), progress)

    def loglikelihood_tokens(self, requests: Sequence[tuple[h.Ids, h.Ids]],
                             progress: Progress = _noop) -> list[tuple[float, bool]]:
        """Scores distinct requests once, longest first, in chunks; results in request order."""
        distinct, which = h.loglik_schedule(requests)
        scored: list[tuple[float, bool]] = []
        for chunk in h.chunks(distinct, self.chunk_size):
            res = self._call("loglikelihood", chunk, **({"streaming": True} if self.streaming else {}))
            if len(res) != len(chunk):
                raise RuntimeError(f"LLM.loglikelihood returned {len(res)} results for {len(chunk)} requests")
            scored += [(float(ll), bool(greedy)) for ll, greedy in res]
            progress(len(chunk))
        return [scored[w] for w in which]

    # -- loglikelihood_rolling -------------------------------------------------------------------

    def loglikelihood_rolling(self, texts: Sequence[str], progress: Progress = _noop) -> list[float]:
        """Sum of log p over every token of each text (see harness.rolling_requests), the text
        encoded as lm-eval 0.4.13's models encode it (tok_encode: BOS first where the tokenizer adds
        it, so that the first window, after the prefix token, also scores that BOS; the sums equal
        lm-eval's hf model's; add_bos_token=False scores the text's own tokens only). Windows with
        a one-token context go to LLM.loglikelihood_rolling (eval-ppl's semantics: a KV policy
        streams a token a step, its ratios fractions of the tokens scored); a last window with a longer
        context goes to LLM.loglikelihood (context prefilled). Same numbers with the full cache."""
        if self.vocab.prefix_id is None:
            raise h.RequestError("loglikelihood_rolling needs a prefix token: the model has no BOS/EOS "
                                 "(give prefix_token_id in --model_args)")
        streams: list[tuple[int, h.Ids]] = []
        prefills: list[tuple[int, tuple[h.Ids, h.Ids]]] = []
        for t, text in enumerate(texts):
            for ctx, cont in h.rolling_requests(h.encode_text(text, self.vocab), self.vocab.prefix_id,
                                                self.max_length):
                if len(ctx) == 1:
                    streams.append((t, ctx + cont))
                else:
                    prefills.append((t, (ctx, cont)))
        totals = [0.0] * len(texts)
        order = h.sort_order([-len(ids) for _, ids in streams])
        for chunk in h.chunks(order, self.chunk_size):
            res = self._call("loglikelihood_rolling", [streams[j][1] for j in chunk])
            if len(res) != len(chunk):
                raise RuntimeError(f"LLM.loglikelihood_rolling returned {len(res)} results for {len(chunk)} texts")
            for j, ll in zip(chunk, res):
                totals[streams[j][0]] += float(ll)
        for (t, _), (ll, _) in zip(prefills, self.loglikelihood_tokens([r for _, r in prefills])):
            totals[t] += ll
        progress(len(texts))
        return totals

    # -- generate_until --------------------------------------------------------------------------

    def generate_until(self, requests: Sequence[tuple[str, dict | None]], progress: Progress = _noop) -> list[str]:
        """Generates for each (context, gen_kwargs); requests with the same settings share calls,
        longest prompt first; the text is cut at the first 'until' string (or EOS text)."""
        specs = []
        for i, (_, gen_kwargs) in enumerate(requests):
            try:
                specs.append(h.parse_gen_kwargs(gen_kwargs, self.max_gen_toks, self.seed))
            except h.RequestError as e:
                raise h.RequestError(f"generate_until request {i}: {e}") from None
        out: list[str] = [""] * len(requests)
        for group in h.group_by(specs):
            spec = specs[group[0]]
            prompts = {i: h.generation_prompt(requests[i][0], self.vocab, self.max_length, spec.max_gen_toks)
                       for i in group}
            ordered = [group[j] for j in h.sort_order([-len(prompts[i]) for i in group])]
            for chunk in h.chunks(ordered, self.chunk_size):
                # Only when set (an LLM without these keywords still serves the rest), or when the
                # LLM would otherwise take its generation_config.json's value.
                file = getattr(self.llm, "generation_defaults", None) or {}
                extra = {}
                if spec.min_p or "min_p" in file:
                    extra["min_p"] = spec.min_p
                if spec.repetition_penalty != 1.0 or "repetition_penalty" in file:
                    extra["repetition_penalty"] = spec.repetition_penalty
                done = self._call("generate", [prompts[i] for i in chunk], max_new_tokens=spec.max_gen_toks,
                               temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p, seed=spec.seed,
                               stop=[s for s in spec.until if s], **extra)  # the engine ends a sequence there
                if len(done) != len(chunk):
                    raise RuntimeError(f"LLM.generate returned {len(done)} completions for {len(chunk)} prompts")
                for i, c in zip(chunk, done):
                    # The id that ended the sequence (any of LLM.eos_ids: Gemma's <end_of_turn>, LLaMA-3.1's
                    # three) is not text; an EOS drawn mid-text under ignore_eos is cut as the task's stops are.
                    ids = list(c.token_ids)[:-1] if c.finish_reason == "eos" else list(c.token_ids)
                    out[i] = h.cut_at_stops(self.llm.decode(ids), spec.until + (self.eos_text,))
                progress(len(chunk))
        return out
