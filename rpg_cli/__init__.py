"""rpg: KL-regularized policy-gradient algorithms for LLM reasoning, from loss to paper table."""

__version__ = "0.1.0"
