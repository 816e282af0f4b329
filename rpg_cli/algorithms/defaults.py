"""Defaults defined once: the functions' keyword defaults here and the spec's (`clip.c`, `overlong`).

Plain numbers, no torch, so that the spec (and `rpg sweep --dry-run`) can read them.
"""

EPS_LOW = 0.2  # ratio floor 1 - eps_low (clip-higher, as DAPO and the paper's scripts)
EPS_HIGH = 0.28  # ratio ceiling 1 + eps_high
CLIP_C = 10.0  # dual-clip bound for negative advantages (the paper gives none; every released script: 10)

# DAPO's overlong reward shaping
OVERLONG_BUFFER = 512  # tokens before the response budget where the penalty starts
OVERLONG_PENALTY_FACTOR = 1.0
