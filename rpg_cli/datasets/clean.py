"""Turning raw field values into (problem, answer) text, and the English and duplicate filters."""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from rpg_cli.datasets.template import unwrap_prompt

# Why a row is dropped, in the order the pipeline applies the checks.
UNREADABLE = "unreadable"
EMPTY_QUESTION = "empty question"
MISSING_ANSWER = "missing answer"
NON_ENGLISH = "non-English"
DUPLICATE = "duplicate"
DUPLICATE_OTHER_ANSWER = "duplicate, other answer"
DROP_REASONS = (UNREADABLE, EMPTY_QUESTION, MISSING_ANSWER, NON_ENGLISH, DUPLICATE, DUPLICATE_OTHER_ANSWER)

# A problem counts as non-English when at least this share of its letters (LaTeX command names
# not counted) are from scripts other than Latin and Greek: Chinese, Japanese, Korean, Cyrillic,
# Arabic, ... Chinese problems in DAPO-Math-17k sit far above it even when most of their text is
# LaTeX; an English problem quoting one foreign name stays far below.
MAX_FOREIGN_SHARE = 0.05

_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
# Letters that English math text uses: Latin (with accents), Greek, letterlike symbols (ℝ, ℵ)
# and mathematical alphanumerics (𝔽).
_ENGLISH_FRIENDLY_RANGES = (
    (0x0000, 0x024F),
    (0x0370, 0x03FF),
    (0x1D00, 0x1DBF),
    (0x1E00, 0x1FFF),
    (0x2100, 0x214F),
    (0x1D400, 0x1D7FF),
)


def question_text(value: Any) -> str | None:
    """The raw problem in a question field, or None when there is none.

    Accepts plain text, a verl/chat prompt (a list of {role, content} messages: the first user
    message is used) or a single message; a templated prompt is unwrapped to its raw problem.
    Whitespace inside the problem is kept verbatim so that re-preparing a prepared file is exact.
    """
    if isinstance(value, dict):
        value = value.get("content")
    elif isinstance(value, (list, tuple)):
        messages = [m for m in value if isinstance(m, dict)]
        user = [m for m in messages if m.get("role") == "user"] or messages
        value = user[0].get("content") if user else None
    if not isinstance(value, str):
        return None
    problem = unwrap_prompt(value)
    return problem if problem.strip() else None


def answer_text(value: Any) -> str | None:
    """The ground-truth answer as text, or None when missing.

    Numbers are written the way the answer is meant (27.0 read from a CSV or float column is
    "27"); a list (OlympiadBench's final_answer: `["$1$", "$2$"]`) is written "1, 2": each element
    without its math delimiters, as public loaders of that dataset do, so that a scorer sees one
    formula (math-verify reads "1, 2" boxed as the set {1, 2}; "$1$, $2$" would be two formulas).
    """
    if isinstance(value, (list, tuple)):
        if not value or any(isinstance(v, (list, tuple)) for v in value):
            return None
        parts = [answer_text(v) for v in value]
        return None if None in parts else ", ".join(strip_math_delimiters(p) for p in parts)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        return text or None
    return None


_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# integer-valued answer text: "27", "27.0", "033", "+5" (AIME answers are integers 0-999; hub copies
# store some as floats or with leading zeros)
_INTEGER = re.compile(r"[+-]?\d+(?:\.0*)?")


def strip_math_delimiters(text: str) -> str:
    """`$x$`, `$$x$$`, `\\(x\\)`, `\\[x\\]` -> `x`; anything else (`$a$ and $b$`) unchanged."""
    text = text.strip()
    for opening, closing in _DELIMITERS:
        if len(text) > len(opening) + len(closing) and text.startswith(opening) and text.endswith(closing):
            inner = text[len(opening) : -len(closing)].strip()
            if "$" not in inner and inner:
                return inner
    return text


def integer_answer(answer: str) -> str:
    """An integer-valued answer written as the integer ("27.0" -> "27", "033" -> "33"); others unchanged."""
    if not _INTEGER.fullmatch(answer):
        return answer
    return str(int(answer.split(".")[0]))


def foreign_script_share(text: str) -> float:
    """Share of the letters in `text` that belong to scripts English math text does not use.

    Full-width punctuation (，：（）) counts as foreign too: it marks text typed in CJK.
    """
    if text.isascii():
        return 0.0
    letters = foreign = 0
    for ch in _LATEX_COMMAND.sub(" ", text):
        if ch.isalpha():
            letters += 1
            code = ord(ch)
            if not any(low <= code <= high for low, high in _ENGLISH_FRIENDLY_RANGES):
                foreign += 1
        elif "\u3000" <= ch <= "\u303f" or "\uff00" <= ch <= "\uffef":
            letters += 1
            foreign += 1
    return foreign / letters if letters else 0.0


def is_english(text: str) -> bool:
    return foreign_script_share(text) < MAX_FOREIGN_SHARE


def dedup_key(problem: str) -> str:
    """Problems equal up to Unicode form, letter case and whitespace are the same problem."""
    return "".join(unicodedata.normalize("NFKC", problem).casefold().split())
