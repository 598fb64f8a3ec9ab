"""Per-token log-probabilities in OpenAI's response shapes (the Engine's ``TokenLogprob`` records).

Chat completions: ``choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token,
logprob, bytes}]}], "refusal": null}``. Text completions, the legacy shape: ``{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`` where each ``top_logprobs`` entry maps token text to log-probability
over the asked-for alternatives and the emitted token (OpenAI's "up to logprobs + 1" entries), and
``text_offset`` counts characters from the start of the prompt, as OpenAI's do. A token's text is its
UTF-8 bytes decoded, with the bytes of an incomplete character written as ``\\xNN`` escapes; ``bytes``
lists the bytes themselves.
"""
from __future__ import annotations


def token_text(tok, token: int) -> str:
    """The text of one token (``tok``: the target's Tokenizer); bytes of an incomplete UTF-8
    character as ``\\xNN``."""
    return tok.piece(token).decode("utf-8", "backslashreplace")


def _entry(tok, token: int, logprob: float) -> dict:
    return {"token": token_text(tok, token), "logprob": logprob, "bytes": list(tok.piece(token))}


def chat_logprobs(tok, records) -> dict:
    """``choices[].logprobs`` of a chat completion (or of one streamed chunk) for ``records``
    (a list of ``decode.logprobs.TokenLogprob``)."""
    return {"content": [{**_entry(tok, r.token, r.logprob), "top_logprobs": [_entry(tok, t, lp) for t, lp in r.top]}
                        for r in records], "refusal": None}


def completion_logprobs(tok, records, prompt_chars: int) -> dict:
    """``choices[].logprobs`` of a text completion (or one streamed chunk) for ``records``;
    ``prompt_chars``: the prompt's length in characters (where the completion's offsets start)."""
    tops = []
    for r in records:
        top = {token_text(tok, t): lp for t, lp in r.top}
        top.setdefault(token_text(tok, r.token), r.logprob)
        tops.append(top)
    return {"tokens": [token_text(tok, r.token) for r in records],
            "token_logprobs": [r.logprob for r in records], "top_logprobs": tops,
            "text_offset": [prompt_chars + r.text_offset for r in records]}
