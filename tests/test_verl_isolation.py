"""Several verl runs on one Ray cluster each keep their TransferQueue (rpg_cli/backends/verl/isolation.py)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from rpg_cli.backends.verl.isolation import TRANSFER_QUEUE_NAMESPACE, run_namespace

pytest.importorskip("transfer_queue", reason="the verl extra is not installed")


def test_transfer_queue_0_1_11_names_its_actors_in_the_namespace_rpg_moves():
    import transfer_queue
    from transfer_queue import interface
    from transfer_queue.storage.clients import ray_storage_client

    assert transfer_queue.__version__ == "0.1.11"
    for module in (interface, ray_storage_client):
        assert f'namespace="{TRANSFER_QUEUE_NAMESPACE}"' in inspect.getsource(module)


def test_only_transfer_queues_namespace_moves():
    assert run_namespace("transfer_queue", "rpg-1a2b3c4d") == "rpg-1a2b3c4d"
    assert run_namespace("serve", "rpg-1a2b3c4d") == "serve"
    assert run_namespace(None, "rpg-1a2b3c4d") is None


# two drivers of one Ray cluster, as two rpg jobs: each creates TransferQueue's controller where TransferQueue
# names it, and finds its own
DRIVER = textwrap.dedent(
    """
    import sys
    import ray
    from rpg_cli.backends.verl.isolation import per_run_transfer_queue

    address, namespace = sys.argv[1:3]
    ray.init(address=address, namespace=namespace, include_dashboard=False, log_to_driver=False)
    per_run_transfer_queue()

    @ray.remote(num_cpus=0)
    class Controller:
        def owner(self):
            return namespace

    handle = Controller.options(name="TransferQueueController", namespace="transfer_queue").remote()
    found = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    print(ray.get(found.owner.remote()), ray.get(handle.owner.remote()))
    ray.get_actor("TransferQueueController", namespace=namespace)  # it is in the run's own namespace
    """
)


@pytest.mark.slow
def test_two_runs_on_one_cluster_each_find_their_own_controller(tmp_path):
    import ray

    (tmp_path / "driver.py").write_text(DRIVER)
    temp = tempfile.mkdtemp(prefix="rpgiso")  # short: Ray's socket paths have a length limit
    context = ray.init(num_cpus=1, include_dashboard=False, _temp_dir=temp, namespace="test")
    try:
        address = context.address_info["address"]
        outputs = []
        for run in ("rpg-run1", "rpg-run2"):  # the first one's controller still lives (its driver's job ended)
            done = subprocess.run(
                [sys.executable, str(tmp_path / "driver.py"), address, run], capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr[-2000:]
            outputs.append(done.stdout.split()[-2:])
        assert outputs == [["rpg-run1", "rpg-run1"], ["rpg-run2", "rpg-run2"]]
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
