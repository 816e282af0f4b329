"""Prompts in, scored rollouts out: batched sampling with transformers' `generate` and log-probs by a forward pass.

Layout of a rollout batch (verl's): prompts left-padded to a common length P, responses right-padded
to a common length T, so every response starts at column P. A response's valid tokens run up to and
including its first end-of-sequence token (or the whole budget when it never ends).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpg_cli.benchmarks import scorer_for
from rpg_cli.rewards import score_batch


@dataclass(frozen=True)
class Problem:
    prompt_ids: list[int]  # the tokenized prompt (chat template applied)
    ground_truth: str
    data_source: str
    scorer: str | None = None  # None: the table's for data_source (rpg_cli.benchmarks.scorer_for)


@dataclass
class Rollouts:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P) 1 on prompt tokens
    response_ids: torch.Tensor  # (B, T) right-padded
    response_mask: torch.Tensor  # (B, T) 1 on response tokens (through the first eos)
    group: torch.Tensor  # (B,) index of the problem each response answers
    texts: list[str]  # decoded responses (special tokens dropped)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def select(self, index: torch.Tensor) -> Rollouts:
        rows = index.tolist()
        return Rollouts(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.response_ids[index],
            self.response_mask[index],
            self.group[index],
            [self.texts[i] for i in rows],
        )


def encode_prompt(tokenizer, messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
    """The chat template when the tokenizer has one (as verl applies it, with the spec's chat_template_kwargs),
    else the messages' text."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **(chat_template_kwargs or {})
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer("".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as `generate` counts them for left-padded prompts."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's eos and the model's generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(ids)


def generate(
    model,
    tokenizer,
    problems: list[Problem],
    n: int,
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    eos_ids: list[int],
    device: torch.device,
    chunk: int = 256,
) -> Rollouts:
    """n samples per problem (problem i's samples are rows i*n .. i*n+n-1), in chunks of `chunk` sequences.

    Sampling is exactly the spec's (temperature, top-p, no top-k, no repetition penalty): a fresh
    generation config replaces whatever defaults the model directory ships.
    """
    from transformers import GenerationConfig

    prompts = [p.prompt_ids for p in problems for _ in range(n)]
    group = torch.arange(len(problems)).repeat_interleave(n)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    sampling = (
        dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        if temperature > 0
        else dict(do_sample=False)
    )
    config = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos_ids, **sampling)
    pieces = []
    for start in range(0, len(prompts), chunk):
        ids, mask = left_pad(prompts[start : start + chunk], pad)
        ids, mask = ids.to(device), mask.to(device)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        pieces.append((ids, mask, out[:, ids.shape[1] :]))
    width_p = max(p[0].shape[1] for p in pieces)
    width_t = max(max(p[2].shape[1] for p in pieces), 1)
    prompt_ids, prompt_mask, response_ids = [], [], []
    for ids, mask, resp in pieces:  # chunks may differ in widths: re-pad to the batch's
        prompt_ids.append(torch.nn.functional.pad(ids, (width_p - ids.shape[1], 0), value=pad))
        prompt_mask.append(torch.nn.functional.pad(mask, (width_p - mask.shape[1], 0), value=0))
        response_ids.append(torch.nn.functional.pad(resp, (0, width_t - resp.shape[1]), value=pad))
    response_ids = torch.cat(response_ids)
    response_mask = valid_response_mask(response_ids, eos_ids)
    response_ids = torch.where(response_mask.bool(), response_ids, torch.full_like(response_ids, pad))
    texts = tokenizer.batch_decode(response_ids.tolist(), skip_special_tokens=True)
    return Rollouts(torch.cat(prompt_ids), torch.cat(prompt_mask), response_ids, response_mask, group.to(device), texts)


def concat(parts: list[Rollouts], pad: int) -> Rollouts:
    """Rollouts of several generation batches as one (re-padded to common widths)."""
    if len(parts) == 1:
        return parts[0]
    width_p = max(r.prompt_ids.shape[1] for r in parts)
    width_t = max(r.response_ids.shape[1] for r in parts)
    pad_left = lambda x, value: torch.nn.functional.pad(x, (width_p - x.shape[1], 0), value=value)  # noqa: E731
    pad_right = lambda x, value: torch.nn.functional.pad(x, (0, width_t - x.shape[1]), value=value)  # noqa: E731
    return Rollouts(
        torch.cat([pad_left(r.prompt_ids, pad) for r in parts]),
        torch.cat([pad_left(r.prompt_mask, 0) for r in parts]),
        torch.cat([pad_right(r.response_ids, pad) for r in parts]),
        torch.cat([pad_right(r.response_mask, 0) for r in parts]),
        torch.cat([r.group for r in parts]),
        [t for r in parts for t in r.texts],
    )


def valid_response_mask(response_ids: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 up to and including the first eos of each row (every column when there is none).

    A chunk that stopped early was padded past its end, but then each of its rows has an eos.
    """
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, device=response_ids.device)).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0  # strictly after the first eos
    return (~after_eos).long()


def score_rollouts(rollouts: Rollouts, problems: list[Problem]) -> tuple[torch.Tensor, torch.Tensor]:
    """(score, acc) per response with its problem's scorer (the table's, as verl and `rpg eval` score): +1/-1 and 1/0."""
    verdicts: list[dict] = [{}] * len(rollouts.texts)
    answered = [problems[g] for g in rollouts.group.tolist()]
    scorers = [p.scorer or scorer_for(p.data_source) for p in answered]
    for scorer in set(scorers):
        rows = [i for i, s in enumerate(scorers) if s == scorer]
        found = score_batch([rollouts.texts[i] for i in rows], [answered[i].ground_truth for i in rows], scorer)
        for i, verdict in zip(rows, found):
            verdicts[i] = verdict
    scores = torch.tensor([v["score"] for v in verdicts], dtype=torch.float32)
    acc = torch.tensor([float(v["acc"]) for v in verdicts], dtype=torch.float32)
    return scores, acc


def token_log_probs(
    model,
    rollouts: Rollouts,
    temperature: float,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    autocast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(response token) per position (B, T), and the policy's entropy there when asked.

    Logits are divided by the sampling temperature, as verl does, so that log-probs belong to the
    distribution the tokens were drawn from. `autocast`: bfloat16 matmuls on CUDA, float32 log-softmax.
    """
    input_ids, attention_mask = rollouts.input_ids, rollouts.attention_mask
    t = rollouts.response_ids.shape[1]  # the last t + 1 logits predict the response tokens (and one past)
    with torch.autocast(device_type=input_ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = (
            model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids(attention_mask),
                use_cache=False,
                logits_to_keep=t + 1,
            )
            .logits[:, :t]
            .float()
        )
    if temperature > 0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    log_prob = logits.gather(-1, rollouts.response_ids.unsqueeze(-1)).squeeze(-1) - log_norm
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return log_prob, entropy
