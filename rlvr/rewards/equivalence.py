"""Mathematical equivalence through the `math-verify` package (Hugging Face): "1/2", "0.5" and
"\\frac{1}{2}" are the same answer. Total on any model output."""

from __future__ import annotations

import logging
import re

from rlvr.records import Prompt
from rlvr.rewards.answer import answer_tag

_THOUSANDS = re.compile(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))")

logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we run its timeouts off: rlvr runs its own


def math_equal(completion: str, prompt: Prompt) -> float:
    """1.0 when the completion's final answer (in its last <answer> tags if any; there, or else in
    the whole completion, its last \\boxed{} or else its last expression) is mathematically equal
    to the ground truth, else 0.0. Thousands separators are dropped ("1,932" is 1932). A GSM8K-style
    ground truth ("…#### 72") is read after its "####".

    math-verify's own signal-based timeouts are off: rlvr's `reward.timeout_s` bounds each call.

    >>> p = Prompt(messages=[], answer="\\\\frac{1}{2}")
    >>> math_equal("so the answer is $\\\\boxed{0.5}$", p), math_equal("$\\\\boxed{1/3}$", p), math_equal("", p)
    (1.0, 0.0, 0.0)
    >>> math_equal("It is 72.", Prompt(messages=[], answer="48 + 24 = 72\\n#### 72"))
    1.0
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_text = _THOUSANDS.sub("", prompt.answer.rsplit("####", 1)[-1].strip())
    if not gold_text:
        return 0.0
    extraction = [LatexExtractionConfig(), ExprExtractionConfig()]
    gold = parse(gold_text if "$" in gold_text or "\\" not in gold_text else f"${gold_text}$",
                 extraction_config=extraction, parsing_timeout=None)
    tagged = answer_tag(completion)
    answer = parse(_THOUSANDS.sub("", completion if tagged is None else tagged), extraction_config=extraction,
                   parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    try:
        return float(verify(gold, answer, timeout_seconds=None))
    except Exception:  # math-verify is total in intent; sympy edge cases are not
        return 0.0
