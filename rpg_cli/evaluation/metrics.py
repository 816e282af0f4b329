"""Accuracy@k metrics over k scored samples per problem (MATH.md section 7).

Inputs are per problem, in sample order: `correct[p][j]` is whether sample j of problem p was right,
`answers[p][j]` its extracted answer (None when nothing was extracted). Every metric is a plain
function of those lists so that any stored evaluation can be recomputed from its samples.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): P(at least one of k samples drawn without replacement
    from n, of which c are correct, is correct) = 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which avoids huge binomials; 1.0 when n - c < k.
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"pass_at_k: {name} must be an int, got {value!r}")
    if n < 1:
        raise ValueError(f"pass_at_k: n (samples) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c (correct samples) must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _check_samples(correct: Sequence[Sequence[bool]], metric: str) -> None:
    if not correct:
        raise ValueError(f"{metric}: no problems given")
    for p, samples in enumerate(correct):
        if not samples:
            raise ValueError(f"{metric}: problem {p} has no samples")


def mean_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """mean@k (the paper's "Mean@32"): the fraction of correct samples per problem, averaged over problems."""
    _check_samples(correct, "mean_at_k")
    return sum(sum(map(bool, samples)) / len(samples) for samples in correct) / len(correct)


def majority_answer(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the vote, or None when no sample extracted an answer.

    Samples without an answer (None) do not vote. Ties go to the answer that appeared first in
    sample order, and the winner is represented by its first occurrence, so the result is deterministic.
    """
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(j for j, a in enumerate(answers) if a is not None and votes[a] == top)


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """maj@k: per problem, the majority answer over its k samples (see `majority_answer`) scores
    the correctness of the first sample that gave it; 0 when no sample has an answer. Averaged over problems.
    """
    _check_samples(correct, "maj_at_k")
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k: {len(answers)} problems of answers but {len(correct)} of correctness")
    total = 0.0
    for p, (problem_answers, samples) in enumerate(zip(answers, correct)):
        if len(problem_answers) != len(samples):
            raise ValueError(f"maj_at_k: problem {p} has {len(problem_answers)} answers but {len(samples)} verdicts")
        winner = majority_answer(problem_answers)
        total += 0.0 if winner is None else float(bool(samples[winner]))
    return total / len(correct)


def std_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """std@k: the spread of single-sample evaluations. Sample index j defines one full evaluation
    (sample j of every problem) with accuracy acc_j; this is the population standard deviation of
    acc_0 .. acc_{k-1}, i.e. how much a mean@1 score moves between reruns. 0.0 when k = 1.
    All problems must have the same number of samples k.
    """
    _check_samples(correct, "std_at_k")
    k = len(correct[0])
    if any(len(samples) != k for samples in correct):
        raise ValueError("std_at_k: every problem needs the same number of samples")
    per_index = [sum(bool(samples[j]) for samples in correct) / len(correct) for j in range(k)]
    mean = sum(per_index) / k
    return math.sqrt(sum((acc - mean) ** 2 for acc in per_index) / k)


def pass_at_k_curve(n: int, c_list: Sequence[int]) -> dict[int, float]:
    """pass@k averaged over problems for k = 1, 2, 4, ... up to n (n itself included).

    `c_list[p]` is the number of correct samples out of n for problem p.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"pass_at_k_curve: n (samples) must be an int >= 1, got {n!r}")
    if not c_list:
        raise ValueError("pass_at_k_curve: no problems given")
    ks = [1 << e for e in range(n.bit_length())]  # powers of two <= n
    if ks[-1] != n:
        ks.append(n)
    return {k: sum(pass_at_k(n, c, k) for c in c_list) / len(c_list) for k in ks}
