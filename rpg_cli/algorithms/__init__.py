"""The math of the RPG paper in pure torch (MATH.md): KL estimators, advantages, policy losses.

Imports nothing else of the project, so any trainer (verl, the local backend, a notebook) can use it.
"""

from rpg_cli.algorithms.losses import LOSS_AGG_MODES, LOSS_NAMES, aggregate, kl_penalty_loss, policy_loss

__all__ = ["LOSS_AGG_MODES", "LOSS_NAMES", "aggregate", "kl_penalty_loss", "policy_loss"]
