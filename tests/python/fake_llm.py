# A stand-in for flexh2o.LLM for the lm-eval adapter's tests: a GPT-2-like piece tokenizer
# (a leading space joins the next word, "<s>"/"</s>" special), a deterministic "model" whose
# log-probabilities depend on the whole visible history (so a wrong window or truncation shows),
# scripted generations, and a log of every call with its arguments.
import re
from dataclasses import dataclass

PIECE = re.compile(r"<s>|</s>| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list
    finish_reason: str


class FakeLLM:
    def __init__(self, max_length=16, bos=True, eos=True, script=(), report=None, adds_bos=True, suffix=(),
                 more_eos=()):
        self.pieces = ["<s>", "</s>"]
        self.index = {"<s>": 0, "</s>": 1}
        self.max_length = max_length
        self.bos_id = 0 if bos else None
        self.adds_bos = adds_bos  # encode(text) puts BOS first (SmolLM2's tokenizer does not)
        self.suffix = list(suffix)  # ... and these ids last (add_eos_token)
        self.eos_id = 1 if eos else None
        # LLM.eos_ids: the EOS and these pieces' ids (a model's other end ids: Gemma's <end_of_turn>)
        self.eos_ids = ([1] if eos else []) + [self.id_of(piece) for piece in more_eos]
        self.name = "fake"
        self.script = list(script)  # generated pieces, the same for every prompt
        self.calls = []
        self.streamed = []  # loglikelihood calls' streaming argument
        self.report = report  # what last_report becomes after each call
        self.last_report = None

    # tokenizer -------------------------------------------------------------------------------
    def id_of(self, piece):
        if piece not in self.index:
            self.index[piece] = len(self.pieces)
            self.pieces.append(piece)
        return self.index[piece]

    def encode(self, text, add_special=True):
        ids = [self.id_of(p) for p in PIECE.findall(text)]
        if add_special and self.adds_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_special:
            ids = ids + self.suffix
        return ids

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)

    def show(self, ids):
        return [self.pieces[i] for i in ids]

    # model -----------------------------------------------------------------------------------
    @staticmethod
    def token_logprob(history, token):
        """log p(token | history): every element of the history counts, as does its length."""
        h = sum((k + 1) * t for k, t in enumerate(history))
        return -(1 + (3 * token + 5 * len(history) + h) % 13) / 8

    @staticmethod
    def token_greedy(history, token):
        return (token + len(history)) % 3 == 0

    def score(self, ctx, cont):
        ll = sum(self.token_logprob(ctx + cont[:i], t) for i, t in enumerate(cont))
        return ll, all(self.token_greedy(ctx + cont[:i], t) for i, t in enumerate(cont))

    def loglikelihood(self, requests, streaming=False):
        reqs = [(list(c), list(x)) for c, x in requests]
        self.calls.append(("loglikelihood", reqs))
        self.streamed.append(streaming)
        self.last_report = self.report
        for c, x in reqs:
            assert c and x and len(c) + len(x) - 1 <= self.max_length, (c, x)
        return [self.score(c, x) for c, x in reqs]

    def loglikelihood_rolling(self, seqs):
        seqs = [list(s) for s in seqs]
        self.calls.append(("loglikelihood_rolling", seqs))
        self.last_report = self.report
        for s in seqs:
            assert 2 <= len(s) <= self.max_length + 1, s
        return [self.score(s[:1], s[1:])[0] for s in seqs]

    def generate(self, prompts, *, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                 ignore_eos=False, stop=None, **sampling):
        prompts = [list(p) for p in prompts]
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        assert set(sampling) <= {"min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}, sampling
        self.calls.append(("generate", prompts, dict(max_new_tokens=max_new_tokens, temperature=temperature,
                                                     top_k=top_k, top_p=top_p, seed=seed, stop=stop, **sampling)))
        self.last_report = self.report
        out = []
        for p in prompts:
            assert len(p) + max_new_tokens <= self.max_length, (len(p), max_new_tokens)
            ids = [self.id_of(piece) for piece in self.script][:max_new_tokens]
            end = next((k for k, t in enumerate(ids) if t in self.eos_ids), None)
            if end is not None:
                ids = ids[:end + 1]
            # LLM.generate's stop: the sequence ends at the first token whose text holds one
            ends = [k for k in range(1, len(ids) + 1) if any(s in self.decode(ids[:k]) for s in stop)]
            if ends and (end is None or ends[0] <= end):
                ids = ids[:ends[0]]
                out.append(Completion(self.decode(ids), ids, "stop"))
                continue
            out.append(Completion(self.decode(ids), ids, "eos" if end is not None else "length"))
        return out

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")
