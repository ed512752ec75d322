"""Argument types shared by the pipelines and the benchmarks (nothing heavy imported)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["absolute_path", "positive_int"]


def positive_int(text: str) -> int:
    """Parse an integer of at least 1 (an argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def absolute_path(text: str) -> Path:
    """Parse a path, made absolute from where the command runs (an argparse ``type``).

    The processes a command starts (SuperLink, sites, ServerApp) have working
    directories of their own, so a relative path is resolved at once.
    """
    return Path(text).expanduser().resolve()
