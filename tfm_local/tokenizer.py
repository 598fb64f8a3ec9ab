"""Text ↔ tokens for a loaded model, and the chat template stored in its GGUF.

Tokenization and pieces come from llama.cpp (llama_tokenize /
llama_token_to_piece); chat templates are rendered with Jinja2's sandbox, as
Hugging Face tokenizers do, from the ``tokenizer.chat_template`` GGUF key.
"""
from __future__ import annotations

import codecs
import ctypes
from datetime import date

import jinja2
import jinja2.sandbox
import llama_cpp as lc

from .llm import Model


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed."""


class Tokenizer:
    """Tokenizer of ``model``: ``encode`` to token ids, ``piece`` to bytes, ``is_eog``."""

    def __init__(self, model: Model):
        self.model = model
        self.vocab = model.vocab
        self.n_vocab = model.n_vocab
        self.eos = lc.llama_vocab_eos(self.vocab)
        self.bos = lc.llama_vocab_bos(self.vocab)
        self._pieces: dict[int, bytes] = {}

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (BOS added when the model asks for it and ``add_special``)."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """UTF-8 bytes of one token (special tokens rendered as text)."""
        p = self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
            p = self._pieces[token] = buf.raw[:n]
        return p

    def decode(self, tokens) -> str:
        """Text of a token sequence (invalid UTF-8 replaced)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, <|im_end|> ...)."""
        return bool(lc.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of ``token`` as stored in the GGUF."""
        return lc.llama_vocab_get_text(self.vocab, token) or b""


class StreamDecoder:
    """Incremental detokenizer: feed token ids, get text pieces that are whole UTF-8."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        """Text completed by ``token`` (may be empty inside a multi-byte character)."""
        return self._dec.decode(self.tok.piece(token))

    def flush(self) -> str:
        """Whatever is left at the end of the stream."""
        return self._dec.decode(b"", final=True)


def _raise(msg):
    raise jinja2.exceptions.TemplateError(msg)


def render_chat(model: Model, tok: Tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render OpenAI-style ``messages`` with the model's GGUF chat template.

    Raises ChatTemplateError when the model has no template or the template
    rejects the messages (its ``raise_exception`` message is kept).
    """
    src = model.meta("tokenizer.chat_template")
    if not src:
        raise ChatTemplateError(f"{model.path.name} has no chat template; pass a plain prompt string instead")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=lambda f: date.today().strftime(f))
    try:
        return env.from_string(src).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=tok.piece(tok.bos).decode("utf-8", "replace") if tok.bos >= 0 else "",
            eos_token=tok.piece(tok.eos).decode("utf-8", "replace") if tok.eos >= 0 else "")
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from e
