"""An error or a reason as the one line a node's log, status.json and DONE.json carry."""

from __future__ import annotations

REASON_LIMIT = 500


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """`Type: message` on one line; with a limit, at most that many characters, cut at a word
    (a step's reason: the start says what happened)."""
    text = f"{type(exc).__name__}: {exc}"
    return trim_reason(text, limit) if limit else " ".join(text.split())


def trim_reason(text: str, limit: int = REASON_LIMIT) -> str:
    """One line of at most `limit` characters, cut at a word: the start (the first error line)
    is what says what happened."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 4]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + " ..."
