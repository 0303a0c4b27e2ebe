"""What the front end reads from the process once and hands to the engine: the Hugging Face
cache locations, the presets folder (configs/ inside the package), whether stderr is a TTY,
whether mpirun started the process (as the flexh2o binary's main() decides it)."""

import os
import sys
from pathlib import Path


def configs_dir() -> str:
    """configs/ shipped inside the package (a wheel) or linked into the build tree's package."""
    return str(Path(__file__).absolute().parent / "configs")  # not resolved: the build tree links files


def hub_env() -> dict:
    return {
        "hf_hub_cache": os.environ.get("HF_HUB_CACHE") or None,
        "hf_home": os.environ.get("HF_HOME") or None,
        "home": os.environ.get("HOME") or None,
    }


def under_mpirun() -> bool:
    return any(os.environ.get(k) for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"))


def mpi_ranks() -> int:
    """The job's ranks where OMPI_COMM_WORLD_SIZE or PMI_SIZE says; 0: unknown."""
    for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        v = os.environ.get(k, "")
        if v.strip().isdigit():
            return int(v)
    return 0


def stderr_is_tty() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        return False
