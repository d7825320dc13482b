"""How a Ray cluster says it is raystream's: keys in its key-value store (the GCS)
under the namespace ``raystream``.

Every raystream driver writes the mark :data:`MARK_KEY` when it starts or joins Ray
(:func:`raystream.core.ray_start.ensure_ray`), and job masters keep the job directory
there (``job:...``, :mod:`raystream.engine.registry`). A Ray whose store has no key in
that namespace has never run raystream: the ``raystream`` command does not attach
to it unless it is named (``--address``, ``RAY_ADDRESS``).

    >>> MARK_KEY, KV_NAMESPACE
    ('cluster', 'raystream')
"""

from __future__ import annotations

import json
import os
import time

KV_NAMESPACE = "raystream"
MARK_KEY = "cluster"

_marked: set[str] = set()  # the clusters (GCS addresses) this process marked: once each


def mark_cluster() -> None:
    """Write the mark into the store of the Ray this process is connected to (once)."""
    import ray
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return
    cluster = ray.get_runtime_context().gcs_address
    if cluster in _marked:
        return
    first = json.dumps({"pid": os.getpid(), "at": time.time()})
    internal_kv._internal_kv_put(MARK_KEY, first, overwrite=False, namespace=KV_NAMESPACE)
    _marked.add(cluster)
