"""One prompt's progress through a generation."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_REASONS = ("eos", "stop", "length")


@dataclass
class Sequence:
    """``prompt_ids`` and the tokens generated after them, in cache slot ``slot``.

    ``text`` is the decoded output so far (cut before a stop string once one appears); ``streamed`` counts the
    characters of it already handed to a streaming callback. ``finish_reason``: ``"eos"`` (an end-of-sequence
    token, not part of the output), ``"stop"`` (a stop string) or ``"length"`` (``max_new_tokens`` reached).
    """

    index: int
    prompt_ids: list[int]
    slot: int
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    streamed: int = 0
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def finish(self, reason: str) -> None:
        if reason not in FINISH_REASONS:
            raise ValueError(f"finish reason must be one of {FINISH_REASONS}, got {reason!r}")
        self.finish_reason = reason
