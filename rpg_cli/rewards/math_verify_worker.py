"""Child side of the math-verify pool: parse and verify one item at a time under a wall-clock alarm.

Started as `python -m rpg_cli.rewards.math_verify_worker FD` where FD is its end of a socket pair.
Runs in its own process, in that process's main thread, so a SIGALRM timer can interrupt sympy.
math-verify's own signal timeouts are switched off: ours covers parse, verify and rendering at once,
and an item that exceeds it is reported as timed out instead of silently "wrong".
"""

from __future__ import annotations

import logging
import signal
import sys
from multiprocessing.connection import Connection

from math_verify import parse, verify

from rpg_cli.rewards.dapo import TAIL_CHARS, last_answer_line

logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs every parse failure

_GOLD_CACHE_SIZE = 4096
_PRED_CHARS = 1000  # a rendered prediction longer than this is cut: it is a label, not a proof


class _ItemTimeout(BaseException):
    """Raised by the alarm; a BaseException so that library `except Exception` blocks let it through."""


def _on_alarm(signum, frame):
    raise _ItemTimeout


def wrap_gold(ground_truth: str) -> str:
    """Gold answers are bare LaTeX (`336^\\circ`, `\\frac{1}{2}`); boxing them makes the parser read them as LaTeX."""
    text = ground_truth.strip()
    if "\\boxed" in text or text.startswith("$"):
        return text
    return "\\boxed{" + text + "}"


def wrap_answer_line(line: str) -> str:
    """The content of a response's last `Answer:` line as math-verify must see it: boxed (or kept inside
    its own dollars), so that `1, 2` parses as the set {1, 2} rather than as its last number, 2. Markdown
    bold (`**Answer: 5**`) and a closing full stop are not part of the answer."""
    text = line.strip().strip("*").strip().rstrip(".").strip()
    return text if "$" in text else wrap_gold(text)


def _parse_prediction(solution: str) -> list:
    """The answer the prompt asked for (the last `Answer:` line) when there is one, else whatever
    math-verify finds in the whole response (a \\boxed{} answer, the last number)."""
    line = last_answer_line(solution[-TAIL_CHARS:])
    predicted = parse(wrap_answer_line(line), parsing_timeout=None) if line and line.strip() else []
    return predicted or parse(solution, parsing_timeout=None)


def _parse_gold(ground_truth: str, cache: dict) -> list:
    gold = cache.get(ground_truth)
    if gold is None:
        gold = parse(wrap_gold(ground_truth), parsing_timeout=None) or parse(ground_truth, parsing_timeout=None)
        if len(cache) >= _GOLD_CACHE_SIZE:
            cache.clear()
        cache[ground_truth] = gold
    return gold


def judge(solution: str, ground_truth: str, cache: dict) -> tuple[bool, str | None]:
    """(correct, prediction rendered by sympy or None) for one response; no timeout of its own."""
    gold = _parse_gold(ground_truth, cache)
    predicted = _parse_prediction(solution)
    if not predicted:
        return False, None
    correct = bool(gold) and verify(gold, predicted, timeout_seconds=None)
    return correct, str(predicted[0])[:_PRED_CHARS]


def serve(conn: Connection) -> None:
    """Answer (solution, ground_truth, timeout_s) requests with (correct, pred, timed_out) until EOF."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    cache: dict = {}
    conn.send("ready")
    while True:
        try:
            solution, ground_truth, timeout_s = conn.recv()
        except (EOFError, OSError):
            return
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            try:
                correct, pred = judge(solution, ground_truth, cache)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = (correct, pred, False)
        except _ItemTimeout:
            reply = (False, None, True)
        except Exception:  # a parser bug on one odd answer must not end the worker
            reply = (False, None, False)
        conn.send(reply)


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
