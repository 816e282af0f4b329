"""Each verl run keeps its TransferQueue to itself when several share a Ray cluster.

verl 0.9.1 moves every batch between its workers through TransferQueue (0.1.11), whose controller is a Ray
actor named "TransferQueueController" in the fixed namespace "transfer_queue" (and "RayObjectRefStorage"
likewise). `tq.init` connects to that controller when it exists: a second run on the same cluster joined the
first run's queue and its storage actors collided by name ("TransferQueueStorageUnit#0 is already taken"),
and the run hung (found by the end-to-end test, whose sweep's runs share one Ray head). Every rpg job runs
verl's driver in a namespace of its own (`ray_kwargs.ray_init.namespace=rpg-<run id>`, set by `launch`), and
`per_run_transfer_queue`, applied by the plugin in every verl process, puts what TransferQueue names in
"transfer_queue" into that namespace instead; its storage actors, named without a namespace, land there too.
"""

from __future__ import annotations

from typing import Any

from rpg_cli.backends.verl.internals import TRANSFER_QUEUE_NAMESPACE


def run_namespace(namespace: str | None, current: str) -> str | None:
    """The namespace a name given in `namespace` goes to: TransferQueue's shared one becomes the run's."""
    return current if namespace == TRANSFER_QUEUE_NAMESPACE else namespace


def per_run_transfer_queue() -> None:
    """Route Ray's named-actor calls for TransferQueue's namespace to this process's own (once per process)."""
    import ray
    from ray.actor import ActorClass

    if getattr(ray.get_actor, "_rpg_per_run", False):
        return
    get_actor, options = ray.get_actor, ActorClass.options

    def own(namespace: str | None) -> str | None:
        return run_namespace(namespace, ray.get_runtime_context().namespace)

    def _get_actor(name: str, namespace: str | None = None) -> Any:
        return get_actor(name, namespace=own(namespace))

    def _options(self, **actor_options: Any) -> Any:
        if "namespace" in actor_options:
            actor_options["namespace"] = own(actor_options["namespace"])
        return options(self, **actor_options)

    _get_actor._rpg_per_run = True
    ray.get_actor = _get_actor
    ActorClass.options = _options
