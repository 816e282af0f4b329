"""The software a GPU node runs rpg's verl backend on, declared once: the versions verl 0.9.1 is paired with
and the bounds of the machines they install on. `requirements/` pins the whole set (tests/test_pins.py checks
it against these); `rpg doctor` and a job's node check compare a node with them.

Pure Python, no import: `rpg --help` reads nothing of it.
"""

from __future__ import annotations

# the stack (requirements/gpu.txt pins every package; these are the ones a node is checked for)
VERL = "0.9.1"
VLLM = "0.24.0"
TORCH = "2.11.0"
TORCH_CUDA = "13.0"  # the CUDA PyPI's torch 2.11.0 is built against
TRANSFORMERS = "5.9.0"
RAY = "2.60.0"

# the machines it installs and runs on
PYTHON_MIN = (3, 10)
PYTHON_MAX = (3, 12)  # verl 0.9.1 requires Python < 3.13
GLIBC_MIN = (2, 31)  # vLLM's llguidance ships manylinux_2_31 wheels only
DRIVER_MIN = 580  # CUDA 13.0's minimum NVIDIA driver (Linux): older drivers install torch and see no GPU
