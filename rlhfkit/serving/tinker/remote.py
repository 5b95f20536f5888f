"""The model host in a Ray actor: `rlhfkit serve-training --distributed.backend ray`.

The HTTP server (app.py) stays in the process that was started; the base model, the training
clients' adapters (or full copies), their optimizer states and the samplers live in one
`HostActor`, which Ray places on a node with the resources it asks for (a GPU when the cluster has
one). `RemoteHost` gives the app the same methods as `ModelHost`, each a call into the actor; the
app already runs every model method on its one worker thread, so the actor sees the requests (and
the batches of them the app's queue makes) one at a time, in the order a local host does. An error
raised in the actor (a `DataError` for a bad datum, say) is raised again here as itself, so the
client reads the same one line.

The actor loads the model itself (a hub name is downloaded on its node; a local folder must be on
a path that node can read). It holds the whole model on its device: the backend moves the work
off the server's machine onto the cluster's GPU, it does not shard a model over several.
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch

# The ModelHost methods the app calls.
METHODS = ("create_model", "info", "unload", "forward_backward_many", "optim_step", "save_state", "save_for_sampler",
           "load_state", "create_sampler", "sampler_path", "sample")


class HostActor:
    """A `ModelHost` built inside the actor: `make_host()` (a picklable function) loads the model."""

    def __init__(self, make_host, num_threads: int | None):
        torch.set_num_threads(num_threads or os.cpu_count() or 1)  # Ray's default for a 1-CPU actor is one
        self.host = make_host()

    def describe(self) -> dict[str, Any]:
        h = self.host
        return {"name": h.name, "max_context_length": h.max_context_length, "device": str(h.device)}

    def call(self, method: str, *args, **kwargs):
        return getattr(self.host, method)(*args, **kwargs)


class RemoteHost:
    """The `ModelHost` interface of a `HostActor` (see the module docstring)."""

    def __init__(self, make_host, num_gpus: float = 0.0, num_threads: int | None = None):
        cls = ray.remote(HostActor).options(num_cpus=1, num_gpus=num_gpus)
        self.actor = cls.remote(make_host, num_threads)
        about = self._get(self.actor.describe.remote())
        self.name, self.max_context_length, self.device = about["name"], about["max_context_length"], about["device"]

    @staticmethod
    def _get(ref):
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            if exc.cause is not None:
                raise exc.cause from None
            raise

    def __getattr__(self, name: str):
        if name not in METHODS:
            raise AttributeError(name)

        def call(*args, **kwargs):
            return self._get(self.actor.call.remote(name, *args, **kwargs))

        return call

    def close(self) -> None:
        ray.kill(self.actor)
