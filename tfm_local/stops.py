"""Stop strings over a text stream, holding back text that may begin a stop string."""
from __future__ import annotations


class StopMatcher:
    """Feed text pieces; get back the text safe to emit and whether a stop string was hit."""

    def __init__(self, stops: list[str] | None):
        self.stops = [s for s in (stops or []) if s]
        self.pending = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """Returns ``(text to emit, stopped)``; after a stop the text ends before the stop string."""
        self.pending += piece
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[:min(hits)]
            self.pending = ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        """Text held back at the end of the stream."""
        out, self.pending = self.pending, ""
        return out
