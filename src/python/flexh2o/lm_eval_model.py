# The lm-evaluation-harness model "flexh2o": an lm_eval.api.model.LM over flexh2o.LLM, thin over
# lm_eval_adapter.py / harness.py. Importing this module imports lm_eval and registers the name;
# nothing else in the package imports it, so flexh2o itself never needs lm_eval.
# lm-eval 0.4.x finds models only in its own registry (no plugin discovery), so the plain
# `lm_eval` command does not see it: run `python -m flexh2o.lm_eval ...` (flexh2o/lm_eval.py).
from __future__ import annotations

from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: it loads them only into an empty registry)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from . import harness as h
from .lm_eval_adapter import HarnessAdapter


@register_model("flexh2o")
class FlexH2OLM(LM):
    """--model flexh2o --model_args pretrained=DIR[,kv_policy=h2o,heavy_ratio=0.1,...].

    Every key of --model_args that is not one of harness.ADAPTER_ARGS is passed to flexh2o.LLM
    as a flag (kv_policy, heavy_ratio, recent_ratio, percent="0 100 100 0 100 0", gpu_batch_size,
    cpu_cache_compute, offload_dir, gpu_mem, compress_weight, ...); an unknown one is LLM's
    TypeError, an invalid value its flexh2o.Error. `llm=` takes an already built LLM (Python use).
    """

    def __init__(self, pretrained: str | None = None, llm: Any = None, **kwargs: Any):
        super().__init__()
        args = h.parse_model_args({"pretrained": pretrained if llm is None else "(given)", **kwargs})
        if llm is not None:
            given = sorted(set(args.llm_kwargs) - {"device", "batch_size"})  # lm-eval always passes these
            given = (["pretrained"] if pretrained is not None else []) + given
            if given:
                raise TypeError(f"FlexH2OLM(llm=...) takes no model or LLM flags, got {given}: "
                                "give them to flexh2o.LLM when building it")
        else:
            from flexh2o import LLM  # the extension; only needed when building the model here

            # The tasks' generation kwargs (harness.parse_gen_kwargs) set every sampling value.
            llm = LLM(args.model, **{"generation_config": "none", **args.llm_kwargs})
        self.llm = llm
        self.flags = {k: v for k, v in args.llm_kwargs.items()}
        self.adapter = HarnessAdapter(llm, max_length=args.max_length, max_gen_toks=args.max_gen_toks,
                                      add_bos_token=args.add_bos_token, prefix_token_id=args.prefix_token_id,
                                      seed=args.seed, chunk_size=args.chunk_size, streaming=args.streaming)

    @property
    def max_length(self) -> int:
        return self.adapter.max_length

    @property
    def max_gen_toks(self) -> int:
        return self.adapter.max_gen_toks

    @property
    def eot_token_id(self) -> int | None:
        return self.llm.eos_id

    @property
    def prefix_token_id(self) -> int | None:
        return self.adapter.vocab.prefix_id

    @property
    def tokenizer_name(self) -> str:
        return str(self.llm.name)

    def get_model_info(self) -> dict[str, Any]:
        """Goes into lm-eval's results "config": what ran (the engine's own reports, summed)."""
        return {"flexh2o_model": str(self.llm.name), "flexh2o_llm_flags": self.flags, "flexh2o_engine": self.adapter.engine}

    def tok_encode(self, text: str, add_special_tokens: bool | None = None) -> list[int]:
        return list(self.llm.encode(text, add_special=bool(add_special_tokens)))

    def tok_decode(self, ids: list[int]) -> str:
        return self.llm.decode(list(ids))

    def _bar(self, total: int, what: str, disable: bool) -> tqdm:
        return tqdm(total=total, desc=f"flexh2o {what}", disable=disable or self.rank != 0)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [tuple(r.args) for r in requests]
        with self._bar(len(pairs), "loglikelihood", disable_tqdm) as bar:
            res = self.adapter.loglikelihood(pairs, bar.update)
        for pair, r in zip(pairs, res):
            self.cache_hook.add_partial("loglikelihood", pair, r)
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [r.args[0] for r in requests]
        with self._bar(len(texts), "loglikelihood_rolling", disable_tqdm) as bar:
            res = self.adapter.loglikelihood_rolling(texts, bar.update)
        for text, r in zip(texts, res):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), r)
        return res

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        reqs = [(r.args[0], r.args[1] if len(r.args) > 1 else {}) for r in requests]
        with self._bar(len(reqs), "generate_until", disable_tqdm) as bar:
            res = self.adapter.generate_until(reqs, bar.update)
        for req, r in zip(reqs, res):
            self.cache_hook.add_partial("generate_until", req, r)
        return res

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.llm.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)
