"""The math of the RPG paper in pure torch (MATH.md): KL estimators, advantages, policy losses.

Imports nothing else of the project, so any trainer (verl, the local backend, a notebook) can use it.
The names below load `losses` (and torch) on first use, so that the torch-free `defaults` can be
imported alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpg_cli.algorithms.losses import LOSS_AGG_MODES, LOSS_NAMES, aggregate, kl_penalty_loss, policy_loss

__all__ = ["LOSS_AGG_MODES", "LOSS_NAMES", "aggregate", "kl_penalty_loss", "policy_loss"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rpg_cli.algorithms import losses

        return getattr(losses, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
