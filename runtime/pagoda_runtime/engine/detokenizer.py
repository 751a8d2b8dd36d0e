"""Token ids -> streamed text, one sample at a time, with stop strings matched on the text.

Decoding a token alone is wrong for most tokenizers (SentencePiece drops a leading space, a
multi-byte character may span tokens), so each step decodes a short window of recent tokens and
emits what the new tokens added to it. Text is held back while it ends in a broken UTF-8 sequence
(U+FFFD) and while its end could still grow into a stop string, so the stream never shows either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagoda_runtime.engine.tokenizer import Tokenizer

# Prompt tokens decoded before the first generated one, so its leading space comes out right.
_PROMPT_CONTEXT = 5
_BROKEN = "\ufffd"


@dataclass(frozen=True)
class TextDelta:
    text: str  # new text to stream (may be empty)
    stop: str | None = None  # the stop string that ended the sample, if one matched


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        *,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stops = tuple(stop)
        # A held-back tail ends in a character of some stop before its last one; most text does not.
        self._stop_prefix_chars = frozenset("".join(s[:-1] for s in self._stops))
        self._include_stop = include_stop_str_in_output
        context = list(prompt_token_ids)[-_PROMPT_CONTEXT:]
        self._ids = context
        self._prefix_offset = 0  # window start: tokens decoded only as context
        self._read_offset = len(context)  # tokens before this are already in self._text
        self._text = ""  # decoded text of all generated tokens read so far
        self._emitted = 0  # characters of self._text already streamed
        self.stopped_by: str | None = None

    @property
    def output_text(self) -> str:
        """The text streamed so far."""
        return self._text[: self._emitted]

    def add_tokens(self, token_ids: Sequence[int]) -> TextDelta:
        if self.stopped_by is not None:
            return TextDelta("", self.stopped_by)
        self._ids.extend(token_ids)
        self._text += self._decode_new()
        return self._release(final=False)

    def finish(self) -> str:
        """Everything still held back, for a sample that ended without a stop string."""
        if self.stopped_by is not None:
            return ""
        if self._read_offset < len(self._ids):
            self._text += self._window_text(len(self._ids))[len(self._window_text(self._read_offset)) :]
            self._read_offset = len(self._ids)
        return self._release(final=True).text

    def _window_text(self, end: int) -> str:
        return self._tokenizer.decode(self._ids[self._prefix_offset : end], self._skip_special)

    def _decode_new(self) -> str:
        prefix = self._window_text(self._read_offset)
        full = self._window_text(len(self._ids))
        if full.endswith(_BROKEN) or len(full) < len(prefix):
            return ""  # an incomplete character: wait for the token that completes it
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return full[len(prefix) :]

    def _release(self, final: bool) -> TextDelta:
        match = self._first_stop()
        if match is not None:
            index, stop = match
            self._text = self._text[: index + (len(stop) if self._include_stop else 0)]
            self.stopped_by = stop
            return self._emit(len(self._text), stop)
        end = len(self._text) if final else len(self._text) - self._partial_stop_length()
        return self._emit(max(end, self._emitted), None)

    def _emit(self, end: int, stop: str | None) -> TextDelta:
        delta = self._text[self._emitted : end]
        self._emitted = end
        return TextDelta(delta, stop)

    def _first_stop(self) -> tuple[int, str] | None:
        best = None
        for stop in self._stops:
            # Streamed text cannot hold the start of a stop: that start would have been held back.
            index = self._text.find(stop, self._emitted)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        if not self._text or self._text[-1] not in self._stop_prefix_chars:
            return 0
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._text)), longest, -1):
                if self._text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
