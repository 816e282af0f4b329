"""Training and validation problems from verl-format parquet, and the order the trainer draws them in."""

from __future__ import annotations

import torch

from rpg_cli.backends.local.preflight import BackendError
from rpg_cli.backends.local.rollout import Problem, encode_prompt
from rpg_cli.benchmarks import NoScorerError, problem_key, scorer_for


def load_problems(
    files: list[str],
    tokenizer,
    max_prompt_length: int,
    distinct: bool = False,
    scorers: dict[str, str] | None = None,
    chat_template_kwargs: dict | None = None,
) -> list[Problem]:
    """Rows with `prompt` (chat messages), `reward_model.ground_truth` and `data_source`, as prepare-data writes.

    Each problem carries its scorer (the table's for its data_source, or the spec's `scorers` override) and
    its prompt tokenized with the spec's chat_template_kwargs, as verl and `rpg eval` do.

    Prompts longer than max_prompt_length tokens are dropped, as verl's `filter_overlong_prompts` does.
    `distinct`: a problem repeated in the files (same prompt and ground truth: `benchmarks.problem_key`, as the
    dry run counts problems and `rpg eval` samples them; older evaluation files hold 32 copies) is kept once, its
    first row, so validation samples val.n per problem as `rpg eval` does.
    """
    import pyarrow.parquet as pq

    problems: list[Problem] = []
    seen: set[str] = set()  # the problem keys kept, when distinct
    for name in files:
        try:
            table = pq.read_table(name, columns=["prompt", "reward_model", "data_source"])
        except Exception as e:  # pyarrow raises several types for missing columns / bad files
            raise BackendError(
                f"{name}: not a verl-format parquet with prompt, reward_model, data_source "
                f"({type(e).__name__}); write it with `rpg prepare-data`"
            ) from None
        for row, record in enumerate(table.to_pylist()):
            messages, reward = record["prompt"], record["reward_model"] or {}
            if not messages or reward.get("ground_truth") is None:
                raise BackendError(
                    f"{name}: row {row} has no prompt or no reward_model.ground_truth; "
                    "rewrite the file with `rpg prepare-data`"
                )
            try:
                scorer = scorer_for(str(record["data_source"]), scorers)
            except NoScorerError as e:
                raise BackendError(f"{name}: {e}") from None
            key = problem_key(messages, reward["ground_truth"])
            if distinct and key in seen:
                continue  # a copy of a problem kept: its first row stands for it
            ids = encode_prompt(tokenizer, list(messages), chat_template_kwargs)
            if len(ids) <= max_prompt_length:
                problems.append(Problem(ids, str(reward["ground_truth"]), str(record["data_source"]), scorer))
                seen.add(key)
    if not problems:
        raise BackendError(f"{', '.join(files)}: no prompt fits in {max_prompt_length} tokens; use a longer context")
    return problems


def batch_indices(batch: int, size: int, n_problems: int, seed: int) -> list[int]:
    """The problems of generation batch number `batch` (0-based), epoch after epoch of seeded permutations.

    A pure function of its arguments, so a resumed run draws exactly what an uninterrupted one would.
    """
    out: list[int] = []
    position = batch * size
    while len(out) < size:
        epoch, offset = divmod(position, n_problems)
        order = torch.randperm(n_problems, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        take = order[offset : offset + size - len(out)].tolist()
        out += take
        position += len(take)
    return out
