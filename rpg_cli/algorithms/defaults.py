"""Defaults defined once: the functions' keyword defaults here and the spec's (`clip.c`, `overlong`).

Plain numbers, no torch, so that the spec (and `rpg sweep --dry-run`) can read them.
"""

EPS_LOW = 0.2  # ratio floor 1 - eps_low (clip-higher, as DAPO and the paper's scripts)
EPS_HIGH = 0.28  # ratio ceiling 1 + eps_high
CLIP_C = 10.0  # dual-clip bound for negative advantages (the paper gives none; every released script: 10)

# DAPO's overlong reward shaping
OVERLONG_BUFFER = 512  # tokens before the response budget where the penalty starts
OVERLONG_PENALTY_FACTOR = 1.0

# Today's baselines (MATH.md section 9); each number's source in SOURCES
GSPO_EPS_LOW = 3e-4  # GSPO clips the sequence-level ratio to [1 - 3e-4, 1 + 4e-4]
GSPO_EPS_HIGH = 4e-4
# CISPO: the paper sets no lower bound on the weight. A floor of 1e-9 never binds (w >= e^-20 ~ 2.1e-9 after the
# log-ratio clamp), so this is "no lower bound" with eps_low < 1, as the spec's clip requires.
CISPO_EPS_LOW = 1 - 1e-9
CISPO_EPS_HIGH = 0.2  # the weight's cap 1 + 0.2 (the paper does not give its value; verl's example does)
GMPO_LOG_CLIP = 0.4  # GMPO clips log w to [-0.4, 0.4], the ratio to (e^-0.4, e^0.4)
SAPO_TAU_POS = 1.0  # SAPO's gate temperatures for positive and negative advantages
SAPO_TAU_NEG = 1.05

SOURCES = {
    "gspo.clip": "GSPO (arXiv 2507.18071), section 5.1: the clipping ranges of eq. 5 set to 3e-4 and 4e-4; "
    "verl's examples/gspo_trainer (clip_ratio_low=3e-4, clip_ratio_high=4e-4)",
    "gspo.loss_agg_mode": "GSPO (arXiv 2507.18071), eq. 5: the mean over the group's sequences of the clipped "
    "sequence-level term (per token: seq-mean-token-mean); verl's examples/gspo_trainer/test_gspo_3b_math.sh",
    "cispo.clip": "MiniMax-M1 (arXiv 2506.13585), eq. 5 and the text after it: no lower bound on the weight (eps_low 'a "
    "large value'), only eps_high tuned, its value not given; eps_high 0.2 from verl's "
    "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh (clip_ratio_low=10, clip_ratio_high=0.2)",
    "cispo.loss_agg_mode": "MiniMax-M1 (arXiv 2506.13585), eq. 4: normalised by the group's total token count "
    "(token-mean)",
    "gmpo.clip": "GMPO (arXiv 2507.20673): token-level clipping range (e^-0.4, e^0.4); the authors' "
    "scripts/qwen2.5-math-7b-gmpo.sh (CLIPRANGE=0.4) and verl's examples/gmpo_trainer/README.md "
    "(clip_ratio_low=clip_ratio_high=0.4)",
    "gmpo.loss_agg_mode": "GMPO (arXiv 2507.20673): (1/G) sum over the group's sequences of A_i times the "
    "geometric mean (per token: seq-mean-token-mean)",
    "sapo.tau": "SAPO (arXiv 2511.20347), section 5.1: tau_pos = 1.0, tau_neg = 1.05; verl 0.9.1's ActorConfig "
    "defaults and examples/sapo_trainer/run_qwen30b_sapo.sh",
    "sapo.loss_agg_mode": "SAPO (arXiv 2511.20347), its objective: (1/G) sum_i (1/|y_i|) sum_t "
    "(seq-mean-token-mean), which verl 0.9.1's compute_policy_loss_sapo always uses",
}
