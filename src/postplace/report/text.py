"""Text that must fit a cell: a note cut at a word boundary with an ellipsis, never mid-word."""

from __future__ import annotations

ELLIPSIS = "..."


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: whole when it fits, else cut after its last whole word
    that fits (trailing punctuation dropped) and ended with ``...``; a first word longer than the cell
    is cut inside (there is no boundary to cut at).

    Examples
    --------
    >>> note = "no single device fits graph 'resnet50-profiled' on cluster 'epyc-k80x4-3gb': the smallest peak"
    >>> clip(note, 80)
    "no single device fits graph 'resnet50-profiled' on cluster 'epyc-k80x4-3gb'..."
    >>> clip("OOM: does not fit", 40)
    'OOM: does not fit'
    """
    text = " ".join(str(text).split())  # one line: a cell has no room for the note's own line breaks
    if len(text) <= width:
        return text
    room = max(width - len(ELLIPSIS), 1)
    head = text[: room + 1]  # one character more: a cut just before a space keeps the whole word
    cut = head.rfind(" ")
    head = head[:cut] if cut > 0 else text[:room]
    return head.rstrip(" :;,.-(") + ELLIPSIS
