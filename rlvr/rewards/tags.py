"""Reading the answer tag of a completion: a leaf that every reward module may import."""

from __future__ import annotations


def answer_tag(completion: str) -> str | None:
    """The content of the last <answer>…</answer>, stripped; for nested tags, the innermost.

    >>> answer_tag("so <answer> 42 </answer>"), answer_tag("<answer><answer>7</answer></answer>")
    ('42', '7')
    >>> answer_tag("<answer>1</answer> no, <answer>2</answer>"), answer_tag("<answer>5"), answer_tag("")
    ('2', None, None)
    """
    start = completion.rfind("<answer>", 0, max(completion.rfind("</answer>"), 0))
    if start < 0:
        return None
    return completion[start + len("<answer>") : completion.index("</answer>", start)].strip()
