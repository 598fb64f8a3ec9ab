"""The error type of tfm-convert."""


class ConvertError(ValueError):
    """A conversion cannot proceed: bad input checkpoint, bad target, or a mismatch.

    The message is meant for the user as is (the CLI prints it after
    ``tfm-convert: error:`` and exits with status 2).
    """
