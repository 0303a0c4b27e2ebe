"""flexh2o from Python: the engine of the flexh2o command line (the same libraries, flags and
messages) behind `flexh2o.LLM`, and the command line itself as `python -m flexh2o`."""

from ._flexh2o import Error, __version__  # the release CMake's project() names
from ._llm import LLM, Completion

__all__ = ["LLM", "Completion", "Error"]
