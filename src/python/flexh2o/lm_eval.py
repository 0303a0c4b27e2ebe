# `python -m flexh2o.lm_eval ARGS`: lm-evaluation-harness's own command line with the "flexh2o"
# model registered first. lm-eval 0.4.x looks models up only in its built-in registry (no entry
# points or plugin path), so the plain `lm_eval --model flexh2o` cannot find an outside package;
# ARGS are exactly `lm_eval`'s (e.g. --model flexh2o --model_args pretrained=DIR,... --tasks T).
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ModuleNotFoundError as e:  # the optional extra: `pip install flexh2o` alone has no lm-eval
        if e.name not in ("lm_eval", "lm_eval.__main__"):
            raise  # lm-eval is there, one of its own dependencies is not: its own error says which
        print(f"flexh2o-lm-eval: lm-evaluation-harness is not installed ({e}); install it with "
              "`pip install 'flexh2o[lm-eval]'` (or `pip install 'lm-eval>=0.4.13,<0.5'`)", file=sys.stderr)
        sys.exit(2)

    from flexh2o import lm_eval_model  # noqa: F401  (registers "flexh2o")

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
