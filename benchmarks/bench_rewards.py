"""Reward scorers: speed and agreement.

1. dapo: rpg's "Answer:" rule vs verl's `math_dapo.compute_score` on the same generated responses
   (every one carries an Answer: line), on one core. Target: >= 1.5x verl's responses/s, 0 differing verdicts.
2. math_verify: the AIME24/AIME25/AMC23 rows of ../shared/data (their ground truths rendered as
   responses in several styles, one in four perturbed to a wrong answer), with 2 worker processes:
   rows/s, timeouts, and verdicts that disagree with how each response was built.

    python benchmarks/bench_rewards.py [--responses 100000] [--seed 0]

BENCH_QUICK=1: 2,000 responses, the first 200 math_verify rows; a differing verdict still fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.5
QUICK = os.environ.get("BENCH_QUICK") == "1"  # CI: tiny sizes, timings printed but not judged
QUICK_ROWS = 200  # math_verify rows in quick mode

# Ground truths in the styles the evaluation and training sets use.
_TRUTHS = [
    "540",
    "336^\\circ",
    "\\frac{1}{2}",
    "-1",
    "3159",
    "45",
    "\\sqrt{2}",
    "3\\sqrt{3}",
    "(A)",
    "0.25",
    "\\frac{3}{4}",
    "12",
    "7",
    "\\pi",
    "1000",
    "2\\pi",
    "x+1",
    "\\text{(B)}",
    "10^\\circ",
    "0",
]
_FILLER = [
    "Let me think step by step.",
    "We compute $x^2 + 3x = 10$, so $x = 2$.",
    "The answer to part (a) is 4.",
    "So the sum is $\\frac{a}{b} = 7$.",
    "Check: 3,000 ways and 12 cm.",
    "Note $\\boxed{3}$ was a guess.",
    "Hence",
    "answer",
    "Therefore the final ANSWER is near.",
    "\\[ \\sum_{i=1}^{n} i = \\frac{n(n+1)}{2} \\]",
    "Plugging in gives $y = -1$.",
    "A unit circle has area $\\pi$.",
    "Résumé: İ ≥ ∑ 3².",
    "Anſwer: 3",
    "Cost \\$5 and 5\\% off.",
]


def _variants(truth: str, rng: random.Random) -> str:
    """An answer written as a model might: the truth itself, a reformatting, or a wrong value."""
    wrong = rng.choice([truth + "1", "1" + truth, "2", truth.replace("1", "7"), "-" + truth])
    choices = [
        truth,
        truth,
        f"${truth}$",
        f"\\boxed{{{truth}}}",
        f"$\\boxed{{{truth}}}$",
        f"x = {truth}",
        f"{truth}.",
        f"{truth} cm",
        f"{truth} degrees",
        f"\\text{{{truth}}}",
        f" {truth} ",
        f"{truth}**",
        f"\\textbf{{{truth}}}",
        wrong,
        wrong,
        f"{wrong} units",
        "",
        "[INVALID]",
        f"\\${truth}",
        f"{truth}\\%",
        f"\t{truth}",
        "\\fracab",
        "\\sqrt2",
        f"${truth}$ and ${wrong}$",
    ]
    if truth.isdigit() and len(truth) > 3:
        choices.append(f"{truth[:-3]},{truth[-3:]}")
    return rng.choice(choices)


def generate_responses(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(response, ground truth) pairs; every response has at least one Answer: line somewhere."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        truth = rng.choice(_TRUTHS)
        body = " ".join(rng.choice(_FILLER) for _ in range(rng.randint(0, 40)))
        label = rng.choice(["Answer:", "Answer: ", "ANSWER :", "answer:", "**Answer:**", "Final Answer:"])
        answer = _variants(truth, rng)
        form = rng.randrange(8)
        if form == 0:  # an earlier, different Answer line: the last one counts
            text = f"{body}\nAnswer: {_variants(truth, rng)}\nWait, let me recheck.\n{label} {answer}"
        elif form == 1:  # bold markdown around the whole line
            text = f"{body}\n\n**{label} {answer}**"
        elif form == 2:  # value on the next line
            text = f"{body}\n{label}\n{answer}"
        elif form == 3:  # chatter after the answer, sometimes pushing it out of the 300-character tail
            text = f"{body}\n{label} {answer}\n" + " ".join(rng.choice(_FILLER) for _ in range(rng.randint(1, 30)))
        elif form == 4:  # boxed answer in the tail as well
            text = f"{body}\n{label} {answer}\nSo the result is $\\boxed{{{truth}}}$."
        else:
            text = f"{body}\n\n{label} {answer}"
        rows.append((text, truth))
    return rows


def load_verl_math_dapo():
    """verl's math_dapo module, loaded from its file (importing the `verl` package needs torch and more), or None."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "utils" / "reward_score" / "math_dapo.py"
    if not path.is_file():
        return None
    module_spec = importlib.util.spec_from_file_location("verl_math_dapo_reference", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _timed_verdicts(score_fn, rows) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    verdicts = [score_fn(text, truth)["acc"] for text, truth in rows]
    return time.perf_counter() - start, verdicts


def _compare(scorers: dict, rows, rounds: int = 10) -> dict[str, tuple[float, list[bool]]]:
    """responses/s and verdicts per scorer; the scorers alternate over chunks so that load from
    other processes on the machine falls on all of them alike."""
    chunk = -(-len(rows) // rounds)
    seconds = {name: 0.0 for name in scorers}
    verdicts: dict[str, list[bool]] = {name: [] for name in scorers}
    for start in range(0, len(rows), chunk):
        for name, score_fn in scorers.items():
            elapsed, chunk_verdicts = _timed_verdicts(score_fn, rows[start : start + chunk])
            seconds[name] += elapsed
            verdicts[name] += chunk_verdicts
    return {name: (len(rows) / seconds[name], verdicts[name]) for name in scorers}


def bench_dapo(count: int, seed: int) -> bool:
    from rpg_cli.rewards.dapo import score_dapo

    rows = generate_responses(count, seed)
    verl = load_verl_math_dapo()
    scorers = (
        {"rpg dapo": score_dapo} if verl is None else {"rpg dapo": score_dapo, "verl math_dapo": verl.compute_score}
    )
    measured = _compare(scorers, rows)
    print(f"dapo scorer, {count:,} generated responses with Answer: lines, one core")
    print(f"  {'scorer':<28}{'responses/s':>14}")
    for name, (rate, _) in measured.items():
        print(f"  {name:<28}{rate:>14,.0f}")
    if verl is None:
        print("  verl not installed: no reference to compare with (ratio and agreement not measured)")
        return True
    (ours_rate, ours), (verl_rate, theirs) = measured["rpg dapo"], measured["verl math_dapo"]
    differing = sum(a != b for a, b in zip(ours, theirs))
    ratio = ours_rate / verl_rate
    print(f"  ratio {ratio:.2f}x (target >= {TARGET_RATIO}x): {'ok' if ratio >= TARGET_RATIO else 'BELOW TARGET'}")
    print(f"  differing verdicts: {differing} (target 0); correct by verl: {sum(theirs):,}")
    return differing == 0  # speed is reported against its target; a verdict mismatch is a failure


def _shared_data() -> Path:
    return Path(os.environ.get("RPG_SHARED_DATA") or REPO.parent / "shared" / "data")


def _off_by_one(truth: str) -> str:
    """A wrong answer in the truth's own style: 336^\\circ -> 337^\\circ, 540 -> 541."""
    digits = len(truth) - len(truth.lstrip("-0123456789"))
    if digits == 0 or truth[:digits] == "-":
        return "1" + truth
    return str(int(truth[:digits]) + 1) + truth[digits:]


def _math_verify_rows(seed: int) -> list[tuple[str, str, bool]] | None:
    """(response, ground truth, should be correct) for every row of the three evaluation sets."""
    files = [_shared_data() / name for name in ("aime-2024.parquet", "aime25.parquet", "amc-23.parquet")]
    if not all(f.is_file() for f in files):
        return None
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    rows = []
    for f in files:
        for reward in pq.read_table(f, columns=["reward_model"]).column("reward_model").to_pylist():
            truth = reward["ground_truth"]
            wrong = rng.randrange(4) == 0
            value = _off_by_one(truth) if wrong else truth
            style = rng.randrange(3)
            text = (
                f"Step 1 ... so the result follows.\n\nAnswer: {value}"
                if style == 0
                else f"Thus the final answer is $\\boxed{{{value}}}$."
                if style == 1
                else f"We get ${value}$.\nAnswer: ${value}$"
            )
            rows.append((text, truth, not wrong))
    return rows


def bench_math_verify(seed: int, workers: int = 2) -> bool:
    from rpg_cli.rewards.math_verify_pool import MathVerifyPool

    rows = _math_verify_rows(seed)
    rows = rows[:QUICK_ROWS] if QUICK and rows else rows
    print(f"\nmath_verify scorer, {workers} worker processes")
    if rows is None:
        print(f"  skipped: the evaluation parquet files are not in {_shared_data()}")
        return True
    with MathVerifyPool(workers=workers) as pool:
        pool.score_one("Answer: 1", "1")  # start-up is not scoring time
        start = time.perf_counter()
        results = pool.score_many([r[0] for r in rows], [r[1] for r in rows])
        elapsed = time.perf_counter() - start
        timeouts = pool.timeouts
    wrong_verdicts = sum(res["acc"] != expected for res, (_, _, expected) in zip(results, rows))
    print(
        f"  rows {len(rows):,}  rows/s {len(rows) / elapsed:,.0f}  timeouts {timeouts}  "
        f"verdicts unlike the construction {wrong_verdicts}"
    )
    return wrong_verdicts == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=2_000 if QUICK else 100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):  # the dapo comparison is single-core by definition
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[0]})
        dapo_ok = bench_dapo(args.responses, args.seed)
        os.sched_setaffinity(0, set(cores))
    else:
        dapo_ok = bench_dapo(args.responses, args.seed)
    math_verify_ok = bench_math_verify(args.seed)
    return 0 if dapo_ok and math_verify_ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
