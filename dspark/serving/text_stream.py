"""The text of a streamed request that is safe to send now.

The engine ends a request at the token that completes a stop string, and its final text is cut
before the stop string. A streamed chunk cannot be taken back, so the text sent while the request
runs holds back its longest suffix that could still become the start of a stop string, and a
trailing replacement character (a multi-byte character whose remaining bytes are in the next
token). Everything sent is then a prefix of the final text.

Decoding is incremental: re-decoding a request's whole output for every chunk made detokenization the largest
single cost of the server's event loop. The text of the first ``base`` tokens is kept once it is settled (it
does not end inside a character), and a new chunk decodes only the tokens from a few before ``base``
(``CONTEXT_TOKENS``, so that a tokenizer's context-dependent spacing sees what precedes them) to the end,
taking what follows the decoding of the context tokens alone. Where that decoding does not start with the
context's (a tokenizer whose decoding of a sequence is not the concatenation of its parts), the whole output
is decoded, as before.
"""

from __future__ import annotations

from typing import Sequence

INCOMPLETE_CHARACTER = "\ufffd"
CONTEXT_TOKENS = 4  # tokens before the settled prefix decoded with the new ones
SETTLE_EVERY = 16  # tokens past the settled prefix before it moves up


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could still turn into (part of) a stop string or
    change when more tokens arrive."""
    hold = len(text) - len(text.rstrip(INCOMPLETE_CHARACTER))
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):  # the longest proper prefix first
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold


class StreamedText:
    """One request's output text, sent in deltas: ``add`` the tokens of each step, ``finish`` with the
    engine's final text."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        self._decode = tokenizer.decode
        self._stops = tuple(stops)
        self._ids: list[int] = []
        self._base = 0  # tokens whose text is settled
        self._base_text = ""  # their text
        self._head = ""  # the decoding of the context tokens before ``_base`` alone
        self.sent = ""

    def text(self) -> str:
        """The decoding of every token added so far (incrementally; see the module docstring)."""
        ids, base, head = self._ids, self._base, self._head
        tail = self._decode(ids[max(0, base - CONTEXT_TOKENS):])
        text = self._base_text + tail[len(head):] if tail.startswith(head) else self._decode(ids)
        if len(ids) - base >= SETTLE_EVERY and not text.endswith(INCOMPLETE_CHARACTER):
            base = len(ids)
            self._base, self._base_text = base, text
            self._head = self._decode(ids[max(0, base - CONTEXT_TOKENS):base])
        return text

    def add(self, token_ids: Sequence[int]) -> str:
        """The text newly safe to send after these tokens ("" when none is)."""
        self._ids.extend(token_ids)
        text = self.text()
        for stop in self._stops:  # a live request never holds a whole stop string; never send past one
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        safe = text[: len(text) - held_back(text, self._stops)]
        return self._advance(safe)

    def finish(self, final_text: str) -> str:
        """The rest of the final text (the engine's, stop strings cut)."""
        return self._advance(final_text)

    def _advance(self, text: str) -> str:
        # A tokenizer whose decoding of a prefix is not a prefix of the whole would make ``text`` part
        # from what was sent; nothing more is sent then (OpenAI clients cannot take text back).
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta = text[len(self.sent):]
        self.sent = text
        return delta
