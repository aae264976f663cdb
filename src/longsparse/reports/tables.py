"""Terminal tables: one row per case, a time column per implementation and its ratio to ours."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(rows: Sequence[dict], columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    """Plain fixed-width table of ``rows`` (dicts), showing ``columns``; floats get 3 significant decimals."""
    headers = list(headers or columns)

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(b) for b in body]
    return "\n".join(out)


def ratio(baseline_ms: float | None, ours_ms: float | None) -> float | None:
    """Speed-up of ours over a baseline (``> 1`` means ours is faster); None if either is missing."""
    if not baseline_ms or not ours_ms:
        return None
    return baseline_ms / ours_ms
