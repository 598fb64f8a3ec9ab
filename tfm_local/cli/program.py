"""The name a command-line tool shows in its usage lines and error messages.

A tool run by a dispatcher as one of its subcommands (``tfm-bench pass``: ``tfm_local.bench.commands``)
shows the dispatcher's spelling; run on its own (an old console-script name, ``python -m``, a test
calling its ``main``) it shows its own name. Standard library only: the dispatcher imports this before
it imports the tool it runs.
"""
from __future__ import annotations

import contextlib
import os
import sys
from contextvars import ContextVar
from typing import Iterator

_RUNNING_AS: ContextVar[str | None] = ContextVar("tfm_program_name", default=None)


def program_name(default: str | None = None) -> str:
    """The tool's name for usage lines and errors: the dispatcher's spelling while ``running_as`` holds
    one (e.g. "tfm-bench pass"), else ``default`` (the tool's own name), else the basename of
    ``sys.argv[0]`` ("tfm" when empty)."""
    return _RUNNING_AS.get() or default or os.path.basename(sys.argv[0]) or "tfm"


def dispatched() -> bool:
    """True while a dispatcher runs the current tool (inside ``running_as``)."""
    return _RUNNING_AS.get() is not None


def alias_note(spelling: str) -> str | None:
    """A help epilog for a tool run under an old name: None while dispatched, else a line naming its
    new ``spelling`` (e.g. "tfm-bench pass")."""
    if dispatched():
        return None
    return f"Also spelled `{spelling}`; this tool's old name goes in a later release."


@contextlib.contextmanager
def running_as(name: str) -> Iterator[None]:
    """Within the block, ``program_name()`` is ``name`` (a non-empty string, e.g. "tfm-bench pass").

    Raises ValueError for an empty name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a program name is a non-empty string, got {name!r}")
    token = _RUNNING_AS.set(name)
    try:
        yield
    finally:
        _RUNNING_AS.reset(token)
