"""Operator upgrades: which workload changes wait their turn, and the turn itself."""

from __future__ import annotations

import threading
import time

from operator_specs import spec
from pagoda_operator import settings
from pagoda_operator.plan import plan_service
from pagoda_operator.reconcile import watched_workloads
from pagoda_operator.render import RenderOptions, render
from pagoda_operator.status import compute_status
from pagoda_operator.upgrade import UpgradeGate, in_namespaces, operator_change, rolling_out, stamped


def _deployment(image: str, generation: int = 3) -> dict:
    rendered = render(
        plan_service(spec()), namespace="ml", name="chat", uid="u", options=RenderOptions(runtime_image=image)
    )
    return stamped(next(o for o in rendered if o["kind"] == "Deployment"), generation)


def test_a_new_operator_default_with_the_same_spec_is_the_operators_change():
    live = _deployment("pagoda-runtime:0.1.0")
    assert not operator_change(_deployment("pagoda-runtime:0.1.0"), live, 3)
    assert operator_change(_deployment("pagoda-runtime:0.2.0"), live, 3)
    # A spec edit (a new generation) rolls at once: the user asked for it.
    assert not operator_change(_deployment("pagoda-runtime:0.2.0", 4), live, 4)
    # A workload of an operator that kept no record waits its turn too.
    unrecorded = {**live, "metadata": {**live["metadata"], "annotations": {}}}
    assert operator_change(_deployment("pagoda-runtime:0.2.0"), unrecorded, 3)
    assert not operator_change(_deployment("pagoda-runtime:0.2.0"), None, 3)


def _workload(name, *, desired=2, updated=2, ready=2, replicas=2, deadline=False, namespace="ml") -> dict:
    conditions = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}] if deadline else []
    return {
        "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": name, "generation": 2},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": 2,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "conditions": conditions,
        },
    }


def test_rolling_out_until_every_pod_is_updated_and_ready():
    assert not rolling_out(_workload("a"))
    assert rolling_out(_workload("a", updated=1))
    assert rolling_out(_workload("a", ready=1))
    assert rolling_out(_workload("a", replicas=3))  # an old pod still terminating beside a surge
    # A rollout stuck past its deadline is broken, not rolling: it must not hold the others for ever.
    assert not rolling_out(_workload("a", ready=0, deadline=True))


def test_the_gate_admits_one_workload_while_no_other_rolls():
    gate, applied = UpgradeGate(), []
    own = ("Deployment", "ml", "a")
    busy = [_workload("a", ready=0), _workload("b", ready=1)]
    assert gate.run_if_idle(lambda: busy, own, lambda: applied.append("a")) == "Deployment ml/b"
    assert applied == []
    # Its own rollout (a spec edit under way) does not hold it.
    idle = [_workload("a", ready=0), _workload("b")]
    assert gate.run_if_idle(lambda: idle, own, lambda: applied.append("a")) is None
    assert applied == ["a"]


def test_a_reconcile_sees_the_rollout_another_one_just_started():
    """Two services' reconciles at once (an operator's start resumes them all): the second lists the
    workloads only once the first has applied, and waits for the rollout that apply started."""
    gate, cluster = UpgradeGate(), {"a": _workload("a"), "b": _workload("b")}
    inside = threading.Event()

    def apply_a():
        inside.set()
        time.sleep(0.2)
        cluster["a"] = _workload("a", ready=0)  # the Deployment controller replaces its pod

    first = threading.Thread(
        target=gate.run_if_idle, args=(lambda: list(cluster.values()), ("Deployment", "ml", "a"), apply_a)
    )
    first.start()
    inside.wait(5)
    applied_b = []
    waits_for = gate.run_if_idle(
        lambda: list(cluster.values()), ("Deployment", "ml", "b"), lambda: applied_b.append(True)
    )
    first.join()
    assert waits_for == "Deployment ml/a" and applied_b == []


class _Cluster:
    """The Kube calls the gate's listing makes: every InferenceService workload of the cluster."""

    def __init__(self, workloads: list[dict]):
        self.workloads = workloads

    def has_api(self, *_) -> bool:
        return False  # no LeaderWorkerSet CRD

    def list_all(self, kind: str, _selector: str) -> list[dict]:
        return [w for w in self.workloads if w["kind"] == kind]


def test_an_operator_watching_namespaces_waits_only_for_rollouts_in_them(monkeypatch):
    own = ("Deployment", "team-a", "chat")
    cluster = _Cluster(
        [
            _workload("chat", namespace="team-a"),
            _workload("left-over", ready=0, namespace="op-1234"),  # another operator's, or none's
            _workload("embed", ready=1, namespace="team-b"),
        ]
    )
    gate, applied = UpgradeGate(), []

    def gate_with(namespaces: tuple[str, ...]) -> str | None:
        monkeypatch.setattr(settings, "_current", settings.OperatorSettings(namespaces=namespaces))
        return gate.run_if_idle(lambda: watched_workloads(cluster), own, lambda: applied.append(namespaces))

    assert gate_with(("team-a",)) is None
    assert gate_with(("team-*",)) == "Deployment team-b/embed"  # --namespace takes globs, as kopf does
    assert gate_with(()) == "Deployment op-1234/left-over"  # every namespace
    assert applied == [("team-a",)]


def test_namespace_globs_select_workloads_as_kopf_selects_namespaces():
    workloads = [_workload("a", namespace=ns) for ns in ("team-a", "team-b", "prod", "team")]
    picked = {w["metadata"]["namespace"] for w in in_namespaces(workloads, ("team-?", "prod"))}
    assert picked == {"team-a", "team-b", "prod"}
    # kopf's exclusions: `kopf run --namespace='team-*,!team-b'` serves team-a and team alone.
    picked = {w["metadata"]["namespace"] for w in in_namespaces(workloads, ("team*, !team-b",))}
    assert picked == {"team-a", "team"}
    assert in_namespaces(workloads, ()) == workloads


def test_status_says_the_upgrade_waits_its_turn():
    waiting = "Deployment chat-bf16-abc123 waits for Deployment other/x-bf16-def456 to finish rolling out"
    status = compute_status(
        plan_service(spec()),
        namespace="ml",
        name="chat",
        generation=1,
        deployments=[],
        pods=[],
        previous=None,
        now="2026-01-01T00:00:00Z",
        upgrade_queued=[waiting],
    )
    progressing = next(c for c in status.conditions if c.type == "Progressing")
    assert (progressing.status, progressing.reason) == ("True", "UpgradeQueued")
    assert waiting in progressing.message
