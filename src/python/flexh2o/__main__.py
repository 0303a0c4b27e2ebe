"""`python -m flexh2o ARGS...`: the flexh2o command line (every subcommand, the same flags,
messages and exit codes as the binary), plus chat lines in `generate`: a chat body's
"messages" are rendered with the model's chat template (flexh2o.LLM.apply_chat_template's
rules). SIGINT/SIGTERM/SIGHUP stop generate/tokenize cleanly, as in the binary. `python -m flexh2o serve` is
the OpenAI-compatible server (serve.py)."""

import json
import sys

from . import _env
from ._chat import ChatTemplate
from ._flexh2o import Error, run_cli

_templates = {}


def render_chat(template_dir: str, body_text: str) -> str:
    """The chat hook of `generate`: the body rendered with the template of `template_dir`
    (ChatTemplate.render_body: its messages, add_generation_prompt, continue_final_message and
    chat_template_kwargs)."""
    body = json.loads(body_text)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise Error("a chat request needs a \"messages\" array")
    if template_dir not in _templates:
        _templates[template_dir] = ChatTemplate.from_dir(template_dir)
    return _templates[template_dir].render_body(body)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["serve"]:
        from .serve import main as serve_main
        return serve_main(args[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    code = run_cli(["flexh2o"] + args, _env.configs_dir(), stderr_is_tty=_env.stderr_is_tty(),
                   handle_signals=True, render_chat=render_chat, mpi=_env.under_mpirun(),
                   mpi_ranks=_env.mpi_ranks(), **_env.hub_env())
    if args[:1] in (["-h"], ["--help"]):  # the binary's list, and the subcommand only Python has
        print("Subcommand of python -m flexh2o only:\n"
              "  serve                       OpenAI-compatible HTTP server (python -m flexh2o serve --help)")
    return code


if __name__ == "__main__":
    sys.exit(main())
