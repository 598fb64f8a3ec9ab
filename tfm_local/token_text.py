"""Which emitted tokens a text stream has given out, for per-token records (log-probabilities).

The engine's text stream decodes tokens into whole UTF-8 characters and holds back text that may begin
a stop string, so a piece of text it yields need not end on a token boundary, and text after a stop
string is never given out. ``TokenSpans`` tracks the characters each token decoded to and, as text is
given out, the tokens it covers: a token is given out once all of its text is (a token that completes no
character yet, inside a multi-byte character, once a character after its start is), and at the end
every token with at least one character in the text.
"""
from __future__ import annotations


class TokenSpans:
    """Character spans of a text stream's tokens and the records of the tokens given out.

    Args:
        records: the per-token records in emitted order (a list that may still grow; ``records[i]`` has a
            ``text_offset`` attribute), or None to track nothing.
    ``out``: the records given out so far, each with ``text_offset`` = its first character's offset in
    the generated text.
    """

    def __init__(self, records: list | None):
        self.records = records
        self.out: list = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.n_decoded = 0

    def decoded(self, n_chars: int) -> None:
        """The next token decoded to ``n_chars`` characters."""
        self.starts.append(self.n_decoded)
        self.n_decoded += n_chars
        self.ends.append(self.n_decoded)

    def flushed(self, n_chars: int) -> None:
        """The decoder's last ``n_chars`` characters at the end (bytes of the last tokens)."""
        self.n_decoded += n_chars
        if self.ends:
            self.ends[-1] = self.n_decoded

    def given_out(self, n_chars: int, final: bool = False) -> None:
        """The stream has given out its first ``n_chars`` characters (``final``: and nothing more will
        come): move the records of the tokens now covered to ``out``."""
        if self.records is None:
            return
        i = len(self.out)
        while i < len(self.starts) and self.starts[i] < n_chars and (final or self.ends[i] <= n_chars):
            rec = self.records[i]
            rec.text_offset = self.starts[i]
            self.out.append(rec)
            i += 1
