"""The paper's "Answer:" rule (DAPO's math rule), written to give verl's `math_dapo` verdicts, faster.

The rule, as the paper's training and evaluation applied it:
  1. look only at the last 300 characters of the response;
  2. take the last match of `(?i)Answer\\s*:\\s*([^\\n]+)` there and normalize it Minerva-style
     (drop text after the last "=", units and filler words, `\\text{}`, `\\boxed{}`, dollars, spaces,
     thousands commas in integers ...); correct when it equals the normalized ground truth exactly;
  3. when no Answer line is found, fall back to the last `\\boxed{...}` within the final 100 characters,
     compared *unnormalized* with the raw ground truth (so `\\boxed{336}` does not match `336^\\circ`).
The rule is deliberately literal: `**Answer: 5**` extracts `5**` and is wrong, as it was in the paper.

Speed comes from work verl repeats on every call: the ground truth is normalized once per distinct
string (cached), regexes are precompiled and skipped when their literal prefix is absent, and plain
numbers take a short path whose output provably equals the full normalization.
"""

from __future__ import annotations

import re
from functools import lru_cache

TAIL_CHARS = 300  # verl: "the longest answer in MATH-500 has 159 characters"
BOX_TAIL_CHARS = 100
# verl's placeholder for "no Answer line"; an Answer line normalizing to it also falls through to the box.
# With nothing found verl compares the placeholder itself to the ground truth; here that is simply
# wrong (pred None), the one place where verdicts could differ (a ground truth of "[INVALID]").
_NO_ANSWER = "[INVALID]"

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
# No rule creates a backslash, so text without one can skip every rule that contains one.
_SUBSTITUTIONS_NO_BACKSLASH = tuple(rule for rule in _SUBSTITUTIONS if "\\" not in rule[0])
_REMOVED_NO_BACKSLASH = tuple(expr for expr in _REMOVED if "\\" not in expr)
_DOLLARS = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
# (literal prefix that must be present, pattern, replacement), applied in this order
_UNWRAP = (
    ("\\text{", re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    ("\\textbf{", re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    ("\\overline{", re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    ("\\boxed{", re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    ("frac", re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),  # \fracab -> \frac{a}{b}
    ("sqrt", re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),  # \sqrta -> \sqrt{a}
)
# Strings free of letters, backslashes, dollars, quotes and braces: no substitution but " " and no
# pattern above can match them, so only spaces and integer commas change.
_PLAIN = re.compile(r'[^A-Za-z\\$"{]*')


def normalize_final_answer(answer: str) -> str:
    """Minerva-style normalization, equal to verl's `math_dapo.normalize_final_answer` on every input."""
    answer = answer.rpartition("=")[2]
    if _PLAIN.fullmatch(answer):
        answer = answer.replace(" ", "")
    else:
        latex = "\\" in answer
        for before, after in _SUBSTITUTIONS if latex else _SUBSTITUTIONS_NO_BACKSLASH:
            answer = answer.replace(before, after)
        for expr in _REMOVED if latex else _REMOVED_NO_BACKSLASH:
            answer = answer.replace(expr, "")
        if answer.count("$") >= 2:  # the pattern needs two dollars; skipping it avoids its O(n^2) scan
            answer = _DOLLARS.sub(r"$\3$", answer)
        for prefix, pattern, replacement in _UNWRAP:
            if prefix in answer:
                answer = pattern.sub(replacement, answer)
        answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


_normalized_truth = lru_cache(maxsize=1 << 14)(normalize_final_answer)


def last_answer_line(text: str) -> str | None:
    """The capture of the last `Answer:` match in `text` (non-overlapping, left to right), or None."""
    start = 0
    if text.isascii():
        # No match can start before the first "answer"; for ASCII text, lower() keeps offsets.
        start = text.lower().find("answer")
        if start < 0:
            return None
    matches = _ANSWER_LINE.findall(text, start)
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` with balanced braces, or None if unclosed/absent."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + 6, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + 7 : i]
    return None


def score_dapo(solution: str, ground_truth: str) -> dict:
    """{"score": +1.0/-1.0, "acc": bool, "pred": normalized answer, raw boxed content, or None}."""
    ground_truth = str(ground_truth)  # parquet readers may hand over numbers
    tail = str(solution)[-TAIL_CHARS:]
    line = last_answer_line(tail)
    if line is not None:
        pred = normalize_final_answer(line)
        if pred != _NO_ANSWER:
            correct = pred == _normalized_truth(ground_truth)
            return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
    boxed = last_boxed(tail[-BOX_TAIL_CHARS:])
    if boxed is not None:
        correct = boxed == ground_truth
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": boxed}
    return {"score": -1.0, "acc": False, "pred": None}
