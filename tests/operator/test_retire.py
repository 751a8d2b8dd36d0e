"""Make before break: which children go, and when."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pagoda_operator.retire import TIME_FORMAT, plan_retirement, replacements_ready

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def child(kind, name, variant, ready=1):
    return {
        "kind": kind,
        "metadata": {"name": name, "labels": {"pagoda.dev/variant": variant}},
        "spec": {"replicas": 1},
        "status": {"readyReplicas": ready},
    }


OLD = [child("Deployment", "old", "a"), child("Service", "old", "a")]
NEW = child("Deployment", "new", "b", ready=0)
WANTED = {("Deployment", "new")}


def retire(*, since=None, ready=False, kept=(), now=NOW, owned=(*OLD, NEW)):
    return plan_retirement(
        wanted=WANTED,
        owned=list(owned),
        kept_variants=set(kept),
        replacements_are_ready=ready,
        since=since,
        now=now,
        timeout_seconds=60,
    )


def test_an_old_variant_serves_until_its_replacement_is_ready():
    waiting = retire()
    assert waiting.delete == () and waiting.waiting == ("old",) and waiting.since == NOW.strftime(TIME_FORMAT)
    done = retire(since=waiting.since, ready=True)
    assert done.delete == (("Deployment", "old"), ("Service", "old")) and not done.timed_out


def test_the_wait_is_bounded_and_says_so():
    since = (NOW - timedelta(seconds=61)).strftime(TIME_FORMAT)
    late = retire(since=since)
    assert late.timed_out and ("Deployment", "old") in late.delete


def test_children_that_serve_nothing_go_at_once_and_a_serving_unfit_variant_stays():
    idle = [child("Deployment", "old", "a", ready=0), child("Service", "old", "a")]
    assert retire(owned=(*idle, NEW)).delete == (("Deployment", "old"), ("Service", "old"))
    assert retire(kept={"a"}).delete == () and retire(kept={"a"}).waiting == ()


def test_replacements_ready_counts_scaled_to_zero_as_ready():
    zero = {**NEW, "spec": {"replicas": 0}}
    assert replacements_ready([zero]) and not replacements_ready([NEW])


def test_a_deployment_moved_onto_several_nodes_serves_until_its_leader_worker_set_has_a_ready_group():
    """Same variant, new kind: the old Deployment is the child the render no longer produces."""
    lws = child("LeaderWorkerSet", "new-lws", "a", ready=0)
    moving = plan_retirement(
        wanted={("LeaderWorkerSet", "new-lws")},
        owned=[child("Deployment", "old", "a"), lws],
        kept_variants=set(),
        replacements_are_ready=replacements_ready([lws]),
        since=None,
        now=NOW,
        timeout_seconds=60,
    )
    assert moving.delete == () and moving.waiting == ("old",)
    assert replacements_ready([child("LeaderWorkerSet", "new-lws", "a")])
