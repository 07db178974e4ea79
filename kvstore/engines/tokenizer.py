"""The reference tokenizer: one token per UTF-8 byte. Deterministic, reversible, no files."""

from __future__ import annotations

from collections.abc import Sequence


class ByteTokenizer:
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # Ids past 255 (the model's vocabulary is larger) fold onto bytes; latin-1 maps every byte
        # to one character, so a streamed piece is always printable on its own.
        return bytes(i % 256 for i in ids).decode("latin-1")

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """An OpenAI `prompt`: text, or a list of token ids."""
        if isinstance(prompt, str):
            return self.encode(prompt)
        ids = list(prompt)
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError("prompt must be a string or a list of non-negative token ids")
        return ids
