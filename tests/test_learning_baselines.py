"""Today's baselines and a custom loss learn the toy task on the local backend, as the paper's algorithms do
(test_local_backend.py): a file of its own so that pytest-xdist runs the two halves on different workers."""

from __future__ import annotations

import pytest
from test_local_backend import FAMILIES, PAPERS, REPO, assert_learns, toy  # noqa: F401 (toy: the fixture)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in PAPERS])
def test_each_baseline_learns_the_toy_task(family, toy, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.syspath_prepend(str(REPO))  # the custom loss's module, examples.my_loss
    assert_learns(family, toy, tmp_path)
