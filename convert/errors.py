"""The error type of tfm-convert, and where the shared file helpers' errors become it."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tfm_local.files.atomic import OutputPathError
from tfm_local.files.gguf_meta import GGUFError


class ConvertError(ValueError):
    """A conversion cannot proceed: bad input checkpoint, bad target, or a mismatch.

    The message is meant for the user as is (the CLI prints it after
    ``tfm-convert: error:`` and exits with status 2).
    """


@contextlib.contextmanager
def convert_errors() -> Iterator[None]:
    """Re-raise, as ConvertError with the same message, what the shared helpers of ``tfm_local.files``
    raise: ``GGUFError`` (a GGUF that cannot be read) and ``OutputPathError`` (an output path that
    cannot become a file). A context manager, or a decorator (``@convert_errors()``) of the
    converter's public functions, so that their callers see ConvertError only."""
    try:
        yield
    except (GGUFError, OutputPathError) as e:
        raise ConvertError(str(e)) from None
