"""The byte-level BPE vocabulary of the synthetic (random-weight) GGUF models.

``TinyVocab`` builds a small tokenizer: the 256 byte tokens, merges learned from a short built-in
text, the ChatML special tokens and unused padding ids up to any vocabulary size (token type
UNUSED, the way Hugging Face conversions pad a vocabulary), written as llama.cpp's ``gpt2``
tokenizer keys. Used by ``tfm_local.testing.hybrid`` and ``tfm_local.testing.synth``.
"""
from __future__ import annotations

import re
from collections import Counter

import gguf

#: Text the merges are learned from (our own words; any short English text works).
_MERGE_CORPUS = (
    "hello world. hello there, world! the quick brown fox jumps over the lazy dog. "
    "the world says hello to the fox and the dog. a small model for a small test: "
    "hello, hello, world, world. tests sample tokens from the model and the drafter. "
    "<think> the answer is in the world of the model </think> def hello(): return 42\n"
)

#: Special tokens, in id order, appended after the learned tokens.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: ChatML template (Jinja) in the style of Qwen2.5 instruct models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TOKEN_NORMAL = int(gguf.TokenType.NORMAL)
_TOKEN_CONTROL = int(gguf.TokenType.CONTROL)
_TOKEN_UNUSED = int(gguf.TokenType.UNUSED)


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte → printable-character map of byte-level BPE.

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls,
    space, etc.) map, in byte order, to the code points 256, 257, ... This is
    the convention llama.cpp's BPE tokenizer (``unicode_byte_to_utf8``)
    expects for the text of byte tokens (GPT-2 scheme, Radford et al. 2019).

    Returns:
        dict of 256 entries, byte value (0..255) → one-character str.
    """
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pretokenize(text: str) -> list[str]:
    """Split text into words (a leading space kept), roughly like GPT-2's pre-tokenizer."""
    return re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", text)


def learn_merges(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Learn byte-level BPE merges from ``text`` (Sennrich et al. 2016).

    Greedy: repeatedly merge the most frequent adjacent pair inside words;
    ties are broken by the pair's text so the result is deterministic.

    Args:
        text: training text (UTF-8 encodable).
        n_merges: wanted number of merges; fewer are returned when no pair
            occurs twice or more.

    Returns:
        list of (left, right) symbol pairs in the byte-to-unicode alphabet,
        in merge-rank order.
    """
    b2u = byte_to_unicode()
    words = Counter(tuple(b2u[b] for b in w.encode("utf-8")) for w in _pretokenize(text))
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        words = Counter({_apply_merge(w, best): c for w, c in words.items()})
    return merges


def _apply_merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    """Replace every occurrence of ``pair`` in ``word`` by the joined symbol."""
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


class TinyVocab:
    """The synthetic tokenizer: tokens, token types and merges.

    Attributes:
        tokens: list[str] of length n_vocab; ids 0..255 are the byte tokens.
        token_types: list[int] (gguf.TokenType values) of length n_vocab.
        merges: list[str], "left right" in rank order.
        special: dict name → id for the SPECIAL_TOKENS.
        unused_ids: list[int] of the UNUSED padding ids (at the end).
    """

    def __init__(self, n_merges: int = 48, n_vocab: int | None = None):
        """Build the vocabulary.

        Args:
            n_merges: merges learned from the built-in text (≤ ~60 possible).
            n_vocab: total size; default = the used size rounded up to a
                multiple of 64 with at least 8 unused ids. Raises ValueError
                when smaller than the used size + 1.
        """
        b2u = byte_to_unicode()
        pairs = learn_merges(_MERGE_CORPUS, n_merges)
        self.tokens = [b2u[b] for b in range(256)]
        for a, b in pairs:  # two merges can spell the same token: keep one entry
            if a + b not in self.tokens:
                self.tokens.append(a + b)
        self.token_types = [_TOKEN_NORMAL] * len(self.tokens)
        self.merges = [f"{a} {b}" for a, b in pairs]
        self.special = {}
        for text in SPECIAL_TOKENS:
            self.special[text] = len(self.tokens)
            self.tokens.append(text)
            self.token_types.append(_TOKEN_CONTROL)
        n_used = len(self.tokens)
        if n_vocab is None:
            n_vocab = -(-(n_used + 8) // 64) * 64
        if n_vocab <= n_used:
            raise ValueError(f"n_vocab={n_vocab} must exceed the {n_used} used tokens")
        self.unused_ids = list(range(n_used, n_vocab))
        self.tokens += [f"[PAD{i}]" for i in self.unused_ids]
        self.token_types += [_TOKEN_UNUSED] * len(self.unused_ids)

    @property
    def n_vocab(self) -> int:
        """Number of tokens, padding included."""
        return len(self.tokens)

    def write_to(self, writer: gguf.GGUFWriter, chat_template: str = CHATML_TEMPLATE) -> None:
        """Add the tokenizer.* keys (gpt2 model, qwen2 pre-tokenizer, ``chat_template``) to ``writer``."""
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        writer.add_token_merges(self.merges)
        writer.add_bos_token_id(self.special["<|endoftext|>"])
        writer.add_eos_token_id(self.special["<|im_end|>"])
        writer.add_pad_token_id(self.special["<|endoftext|>"])
        writer.add_add_bos_token(False)
        writer.add_chat_template(chat_template)
