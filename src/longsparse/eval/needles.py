"""Where a sample's answer sits in its prompt, in tokens and KV blocks: the positions the block selection must cover.

A RULER needle's value (the reference a correct answer contains: ``2395460`` of "One of the special magic numbers for
... is: 2395460.") is found in the prompt text and mapped onto the prompt's tokens; :func:`needle_layout` then says
where those tokens sit against a block-sparse geometry — which KV blocks they occupy, whether they straddle a block
boundary, how far before the end of the prompt they are and whether the first generated token's local window reaches
them (then the selection does not matter for them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..ops.sparse_attn.config import SparseAttentionConfig


@dataclass(frozen=True)
class NeedleSpan:
    """One occurrence of ``reference`` in the prompt: tokens ``[start, end)`` of the prompt's encoding."""

    reference: str
    start: int
    end: int


def token_offsets(tokenizer, text: str) -> list[tuple[int, int]]:
    """Character span of every token of ``tokenizer.encode(text)`` (the fast tokenizer's offsets mapping: the
    encoding ``LLM.generate`` uses for a text prompt)."""
    backend = getattr(tokenizer, "backend", tokenizer)
    enc = backend(text, add_special_tokens=True, return_offsets_mapping=True)
    return [tuple(span) for span in enc["offset_mapping"]]


def needle_spans(tokenizer, prompt: str, references: tuple[str, ...]) -> list[NeedleSpan]:
    """Every occurrence of every reference in ``prompt`` as token spans (tokens whose characters overlap it)."""
    offsets = token_offsets(tokenizer, prompt)
    spans = []
    for ref in references:
        at = prompt.find(ref)
        while ref and at >= 0:
            end = at + len(ref)
            tokens = [i for i, (a, b) in enumerate(offsets) if b > at and a < end and b > a]
            if tokens:
                spans.append(NeedleSpan(ref, tokens[0], tokens[-1] + 1))
            at = prompt.find(ref, end)
    return sorted(spans, key=lambda s: s.start)


@dataclass(frozen=True)
class NeedleLayout:
    """A span against the geometry, seen from the first generated token (position ``prompt_tokens``): its blocks,
    the offset of its first token in its block, whether it crosses a block boundary, its distance from the end of
    the prompt in tokens, and whether all its blocks are in that token's forced local window."""

    reference: str
    start: int
    end: int
    blocks: tuple[int, ...]
    offset_in_block: int
    straddles: bool
    tokens_before_end: int
    in_local_window: bool

    def as_dict(self) -> dict:
        d = asdict(self)
        d["blocks"] = list(self.blocks)
        return d


def needle_layout(span: NeedleSpan, prompt_tokens: int, config: SparseAttentionConfig) -> NeedleLayout:
    B = config.block_size
    blocks = tuple(range(span.start // B, (span.end - 1) // B + 1))
    first_local = prompt_tokens // B - config.local_blocks
    return NeedleLayout(
        reference=span.reference,
        start=span.start,
        end=span.end,
        blocks=blocks,
        offset_in_block=span.start % B,
        straddles=len(blocks) > 1,
        tokens_before_end=prompt_tokens - span.start,
        in_local_window=blocks[0] >= first_local,
    )
