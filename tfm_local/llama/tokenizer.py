"""Text ↔ tokens for a loaded model, and the chat template stored in its GGUF.

Tokenization and pieces come from llama.cpp (llama_tokenize /
llama_token_to_piece); chat templates are rendered with Jinja2's sandbox, as
Hugging Face tokenizers do, from the ``tokenizer.chat_template`` GGUF key.
``encode_chat`` tokenizes a rendered conversation so that the template's own
markers become control tokens while the same text typed inside a message
stays plain text.
"""
from __future__ import annotations

import codecs
import ctypes
import functools
import json
import re
import secrets
from datetime import date

import jinja2
import jinja2.sandbox
import llama_cpp as lc

from .model import Model


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

    @functools.cached_property
    def control_pattern(self) -> re.Pattern | None:
        """Regex matching the text of any control token (``<|im_end|>`` ...), or None when there are none.

        These are the tokens that ``encode(..., parse_special=True)`` turns text
        into (llama.cpp: CONTROL and UNKNOWN attributes; USER_DEFINED tokens are
        always parsed). Longest texts first, so the longest token wins.
        """
        mask = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN
        texts = {self.token_text(t).decode("utf-8", "replace") for t in range(self.n_vocab)
                 if lc.llama_vocab_get_attr(self.vocab, t) & mask}
        texts.discard("")
        if not texts:
            return None
        return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))


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


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False) -> str:
    """The ``tojson`` filter of chat templates: plain ``json.dumps`` keeping the keys' order and
    non-ASCII text, as the templates' authors rendered them (Jinja's own filter sorts the keys and
    escapes ``<``, ``>``, ``&`` and ``'`` for HTML)."""
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def render_chat(model: Model, tok: Tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> str:
    """Render OpenAI-style ``messages`` with the model's GGUF chat template.

    ``tools``: OpenAI-style tool definitions (``{"type": "function", "function": {"name", "description",
    "parameters"}}``) given to the template as its ``tools`` variable, as Hugging Face's
    ``apply_chat_template`` does; None leaves the variable undefined (a template that does not read
    it renders the same either way).
    Raises ChatTemplateError when the model has no template or the template
    rejects the messages (its ``raise_exception`` message is kept).
    """
    src = model.meta("tokenizer.chat_template")
    if not src:
        raise ChatTemplateError(f"{model.path.name} has no chat template; pass a plain prompt string instead")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=lambda f: date.today().strftime(f))
    env.filters["tojson"] = _tojson
    extra = {} if tools is None else {"tools": tools}
    try:
        return env.from_string(src).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=tok.piece(tok.bos).decode("utf-8", "replace") if tok.bos >= 0 else "",
            eos_token=tok.piece(tok.eos).decode("utf-8", "replace") if tok.eos >= 0 else "", **extra)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from e


def _swap_strings(content, fn):
    """``content`` with ``fn`` applied to its text: a string, or OpenAI-style parts ``[{"text": ...}]``."""
    if isinstance(content, str):
        return fn(content)
    if isinstance(content, list):
        return [{**p, "text": fn(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                for p in content]
    return content


def _hide_control_text(messages: list[dict], pattern: re.Pattern, nonce: str) -> tuple[list[dict], list[str]]:
    """Messages whose contents have every control-token text replaced by a placeholder
    (U+E000, ``nonce.i``, U+E001: private-use characters), and the texts replaced, in order."""
    typed: list[str] = []

    def placeholder(m: re.Match) -> str:
        typed.append(m.group(0))
        return f"\ue000{nonce}.{len(typed) - 1}\ue001"

    out = [{**m, "content": _swap_strings(m["content"], lambda text: pattern.sub(placeholder, text))}
           if isinstance(m, dict) and "content" in m else m for m in messages]
    return out, typed


def encode_chat(model: Model, tok: Tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> list[int]:
    """Token ids of ``messages`` (and ``tools``) rendered with the model's chat template (``render_chat``).

    The template's own markers become control tokens, but control-token text
    inside a message's content (a user typing ``<|im_end|>``) is tokenized
    as plain text, so a message cannot end its turn or open another. Each such
    occurrence is swapped for a unique placeholder before rendering; the
    rendered text is cut at the placeholders, the template's parts are
    tokenized with special-token parsing and the typed text without (so the
    tokens either side of it may split where plain tokenization would not).
    A conversation without control-token text gets exactly ``tok.encode(rendered)``.
    BOS is added when the model asks for it, unless the template wrote it.
    """
    typed: list[str] = []
    nonce = secrets.token_hex(6)
    if tok.control_pattern is not None:
        messages, typed = _hide_control_text(messages, tok.control_pattern, nonce)
    text = render_chat(model, tok, messages, add_generation_prompt, tools)
    bos = tok.piece(tok.bos).decode("utf-8", "replace") if tok.bos >= 0 else None
    parts = re.split(f"\ue000{nonce}\\.(\\d+)\ue001", text) if typed else [text]
    ids = tok.encode(parts[0], add_special=not (bos and text.startswith(bos)))
    for i, part in enumerate(parts[1:]):  # placeholder index, template text, index, text, ...
        if i % 2 == 0:
            ids += tok.encode(typed[int(part)], add_special=False, parse_special=False)
        elif part:
            ids += tok.encode(part, add_special=False)
    return ids
