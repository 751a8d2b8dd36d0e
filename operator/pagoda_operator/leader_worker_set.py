"""A variant whose replicas span nodes runs as one LeaderWorkerSet (sigs.k8s.io/lws): the facts of
that API the operator relies on, and the object. Pure.

Each replica is a group of `parallelism.nodes` pods: the leader (worker index 0) serves HTTP and
runs the scheduler, the workers only compute their tensor-parallel ranks. The LWS controller names
and labels the pods and injects LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX, from which
the runtime forms its torch.distributed group. Why these settings:

- `restartPolicy: RecreateGroupOnPodRestart`: a rank that dies takes its collectives with it, so the
  whole group restarts together instead of a lone pod rejoining a group that no longer waits for it.
- `startupPolicy: LeaderCreated`: the leader is ready only once every rank has joined, so workers
  that waited for a ready leader would never start.
- `spec.replicas` counts groups; the scale subresource selects leaders only, so an HPA averages the
  queue depth the leaders report, one figure per group.
"""

from __future__ import annotations

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_API_VERSION = f"{LWS_GROUP}/{LWS_VERSION}"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
# The pod label the LWS controller sets: 0 on each group's leader, 1..size-1 on its workers.
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_SELECTOR = {LABEL_WORKER_INDEX: "0"}


def leader_worker_set(
    metadata: dict, *, size: int, leader_template: dict, worker_template: dict, rolling_update: dict
) -> dict:
    """metadata: the object's own; size: pods per group; rolling_update: maxSurge and
    maxUnavailable, counted in groups. spec.replicas is left out, as for a Deployment (replicas.py)."""
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": metadata,
        "spec": {
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling_update},
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_template,
                "workerTemplate": worker_template,
            },
        },
    }
