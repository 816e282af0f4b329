"""The software a GPU node runs rpg's verl backend on, declared once: the versions verl 0.9.1 is paired with
and the bounds of the machines they install on. `requirements/` pins the whole set (tests/test_pins.py checks
it against these); `rpg doctor` and a job's node check compare a node with them.

Where each value comes from is said beside it (the packages' own metadata, NVIDIA's tables), so that a bump
knows what to re-read. Pure Python, no import: `rpg --help` reads nothing of it.
"""

from __future__ import annotations

# the stack (requirements/gpu.txt pins every package; these are the ones a node is checked for)
VERL = "0.9.1"
VLLM = "0.24.0"  # verl 0.9.1's `vllm` extra pins it (and torch 2.11.0, transformers 5.9.0)
TORCH = "2.11.0"
TORCH_CUDA = "13.0"  # PyPI's torch 2.11.0 requires cuda-toolkit==13.0.2 and the nvidia-*-cu13 wheels
TRANSFORMERS = "5.9.0"
RAY = "2.60.0"
# Not in requirements/gpu.txt: PyPI has only its source, and it compiles against the installed torch (README).
# verl 0.9.1's own pin (its `flash-attn-cu130torch211` extra). flash-attention's GitHub releases hold no CUDA 13
# wheel for torch 2.11 (2.8.3 through 2.8.3.post2), so its setup.py finds none and builds.
FLASH_ATTN = "2.8.3"

# the machines it installs and runs on
PYTHON_MIN = (3, 11)  # numpy 2.3.5, pandas 3.1.1, scipy 1.17.1 and more of the pinned set require Python >= 3.11
PYTHON_MAX = (3, 12)  # verl 0.9.1 requires Python < 3.13
GLIBC_MIN = (2, 31)  # vLLM needs llguidance 1.7.x, whose only Linux x86_64 wheels are manylinux_2_31
MACHINE = "x86_64"  # the only platform requirements/gpu.txt is resolved for
DRIVER_MIN = 580  # CUDA 13.x's minimum NVIDIA driver (Linux): older drivers install torch and see no GPU
# flash-attn 2 runs on Ampere (8.0) and newer; its build compiles for 8.0, 9.0, 10.0 and 12.0 by default
COMPUTE_CAPABILITY_MIN = (8, 0)
