"""spec.adapters: validation, the pods and Jobs rendered, the fit check, the status, and the loading
into running pods through the runtime's API (a fake runtime on loopback)."""

from __future__ import annotations

import base64
import json

import pytest
from fake_runtime import FakeRuntime
from kubernetes_schema import validate
from operator_specs import NAME, NS, UID, first_status, spec
from pagoda_operator import adapter_cache, adapter_cluster
from pagoda_operator.adapter_cache import AdapterDownload
from pagoda_operator.adapter_loading import PodAdapters, PodMemory, adapter_statuses, sync_pod
from pagoda_operator.model_cache import JobPlacement
from pagoda_operator.plan import plan_service
from pagoda_operator.render import POD_SECURITY, RenderOptions, render
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import lora_slot_bytes
from pydantic import ValidationError

REVISION = "e1945c40cd546c78e41f1151f4db032b271faeaa"
SQL = {"name": "sql", "source": "hf://org/sql-lora", "revision": REVISION, "rank": 16}
TONE = {"name": "tone", "source": "pvc://fine-tunes/tone/checkpoint-1200"}
LEGAL = {"name": "legal", "source": "s3://adapters/legal", "s3": {"credentialsSecretName": "keys"}}
FAMILY = {"source": "pvc://models/llama-3-8b", "family": "llama-3-8b"}


def deployment(s) -> dict:
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=RenderOptions())
    (found,) = [o for o in objects if o["kind"] == "Deployment"]
    return found


def args(s) -> list[str]:
    return deployment(s)["spec"]["template"]["spec"]["containers"][0]["args"]


def flag(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


# ---- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "-sql", "sql lora", "sql-", "a" * 129])
def test_bad_adapter_names_are_refused(name):
    with pytest.raises(ValidationError, match="name"):
        spec(adapters=[{**SQL, "name": name}])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"adapters": [SQL, {**TONE, "name": "sql"}]}, "adapter names must be unique"),
        (
            {"adapters": [{**SQL, "rank": 32}], "runtime": {"maxLoraRank": 16}},
            "an adapter's rank is above runtime.maxLoraRank: raise maxLoraRank",
        ),
        ({"adapters": [SQL], "runtime": {"enableLora": False}}, "adapters need runtime.enableLora"),
        ({"adapters": [{**SQL, "revision": None}]}, "an hf:// adapter needs revision"),
        ({"adapters": [{**TONE, "revision": REVISION}]}, "apply only to hf:// sources"),
        ({"adapters": [{**TONE, "s3": {}}]}, "s3 applies only to s3:// sources"),
        (
            {"adapters": [{**SQL, "name": "chat"}], "model": {**FAMILY, "servedName": "chat"}},
            "must not take the base model's name",
        ),
        ({"runtime": {"maxLoras": 8, "maxCpuLoras": 4}}, "maxCpuLoras must be at least runtime.maxLoras"),
        ({"adapters": [{**SQL, "source": "hf://org/sql-lora/model.gguf"}]}, "source"),
        (
            {"adapters": [SQL], "runtime": {"extraArgs": ["--lora-modules", "x=/models/x"]}},
            "declare every adapter in spec.adapters, not --lora-modules",
        ),
    ],
)
def test_invalid_adapter_specs_say_what_is_wrong(changes, message):
    with pytest.raises(ValidationError, match=message):
        spec(**changes)


def test_every_source_kind_validates():
    s = spec(adapters=[SQL, TONE, LEGAL])
    assert [a.scheme for a in s.adapters] == ["hf", "pvc", "s3"]


# ---- pods and Jobs ---------------------------------------------------------------------------------


def test_no_adapters_no_lora_in_the_pods():
    a = args(spec())
    assert "--enable-lora" not in a and "--max-loras" not in a
    volumes = deployment(spec())["spec"]["template"]["spec"]["volumes"]
    assert adapter_cache.CLAIM not in json.dumps(volumes)


def test_adapters_turn_on_lora_with_derived_limits_and_mount_the_cache():
    s = spec(adapters=[SQL, TONE])
    a = args(s)
    assert "--enable-lora" in a
    assert flag(a, "--max-loras") == "4"
    assert flag(a, "--max-lora-rank") == "16"
    assert "--max-cpu-loras" not in a  # the runtime's default: --max-loras
    pod = deployment(s)["spec"]["template"]["spec"]
    assert {
        "name": "adapters",
        "persistentVolumeClaim": {"claimName": "pagoda-adapters", "readOnly": True},
    } in (pod["volumes"])
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    validate(deployment(s))


def network_policy(s) -> dict:
    options = RenderOptions(operator_namespace="pagoda-ops")
    objects = render(plan_service(s), namespace=NS, name=NAME, uid=UID, options=options)
    (found,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    validate(found)
    return found


def test_the_network_policy_admits_the_operator_to_the_api_only_when_adapters_are_served():
    """The operator loads adapters into the pods over HTTP; a policy without it would block that."""
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pagoda-ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "pagoda-operator"}},
    }
    with_adapters = network_policy(spec(adapters=[SQL], networkPolicy={"enabled": True}))
    (http,) = [rule for rule in with_adapters["spec"]["ingress"] if operator in rule["from"]]
    assert http["ports"] == [{"protocol": "TCP", "port": 8000}]
    without = network_policy(spec(networkPolicy={"enabled": True}))
    assert not [rule for rule in without["spec"]["ingress"] if operator in rule["from"]]


def test_the_derived_rank_limit_is_the_largest_rank_rounded_up():
    assert flag(args(spec(adapters=[{**SQL, "rank": 8}])), "--max-lora-rank") == "16"
    assert flag(args(spec(adapters=[{**SQL, "rank": 24}])), "--max-lora-rank") == "32"
    explicit = spec(adapters=[SQL], runtime={"maxLoraRank": 64, "maxLoras": 2, "maxCpuLoras": 8})
    a = args(explicit)
    assert (flag(a, "--max-lora-rank"), flag(a, "--max-loras"), flag(a, "--max-cpu-loras")) == (
        "64",
        "2",
        "8",
    )


def test_adding_or_removing_an_adapter_leaves_the_pod_template_as_it_is():
    """No adapter is in the template, so the Deployment (and its pods) do not change."""
    one = deployment(spec(adapters=[SQL]))
    three = deployment(spec(adapters=[SQL, TONE, LEGAL]))
    ready = deployment(spec(runtime={"enableLora": True}))
    assert one == three == ready
    assert "sql" not in json.dumps(one["spec"]["template"])


def _jobs(s) -> dict[str, dict]:
    placement = JobPlacement(POD_SECURITY, [])
    manifests = adapter_cache.cache_manifests(
        s.model_copy(update={"runtime": s.runtime.model_copy(update={"image": "img"})}), NS, placement
    )
    for manifest in manifests:
        validate(manifest)
    return {m["metadata"]["name"]: m for m in manifests}


def test_each_adapter_is_copied_by_a_job_into_the_shared_claim():
    s = spec(adapters=[SQL, TONE, LEGAL])
    jobs = _jobs(s)
    claim = jobs.pop("pagoda-adapters")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert len(jobs) == 3
    sql = jobs[adapter_cache.adapter_ref(s.adapters[0]).name]
    container = sql["spec"]["template"]["spec"]["containers"][0]
    key = adapter_cache.adapter_ref(s.adapters[0]).key
    assert container["command"] == [
        "pagoda-runtime",
        "fetch",
        "hf://org/sql-lora",
        "--adapter",
        "--cache-dir",
        f"/adapter-cache/{key}",
        "--revision",
        REVISION,
    ]
    assert adapter_cache.replica_path(s.adapters[0]) == f"/adapters/{key}/model"
    tone = jobs[adapter_cache.adapter_ref(s.adapters[1]).name]["spec"]["template"]["spec"]
    assert tone["containers"][0]["command"][2] == "/source/tone/checkpoint-1200"
    assert {"name": "source", "persistentVolumeClaim": {"claimName": "fine-tunes", "readOnly": True}} in tone[
        "volumes"
    ]
    legal = jobs[adapter_cache.adapter_ref(s.adapters[2]).name]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"] for e in legal["env"]} >= {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL",
    }


def test_a_new_revision_is_a_new_copy():
    old = adapter_cache.adapter_ref(spec(adapters=[SQL]).adapters[0])
    new = adapter_cache.adapter_ref(spec(adapters=[{**SQL, "revision": "0" * 40}]).adapters[0])
    assert old.key != new.key


# ---- fit -------------------------------------------------------------------------------------------


def test_the_fit_check_counts_max_loras_slots_of_the_largest_rank():
    resources = {"gpus": 1, "gpuMemory": "20Gi"}
    model = {**FAMILY, "maxModelLen": 8192}
    base = plan_service(spec(model=model, resources=resources)).variants[0].fit
    few = plan_service(spec(model=model, resources=resources, adapters=[SQL])).variants[0].fit
    assert base.fits and few.fits
    # Llama 3 8B: per layer and rank, q and o (4096 + 4096) x 2, k and v (4096 + 1024) x 2, gate,
    # up and down (14336 + 4096) x 3: 81920 values, 32 layers, 2 bytes; 4 slots of rank 16.
    assert few.lora_bytes == 4 * 16 * 81920 * 32 * 2
    assert few.required_bytes == base.required_bytes + few.lora_bytes
    many = plan_service(
        spec(model=model, resources=resources, adapters=[SQL], runtime={"maxLoras": 16, "maxLoraRank": 32})
    ).variants[0]
    assert not many.fit.fits and not many.servable
    assert "LoRA adapter slots 2.50 GiB" in many.fit.describe()


def test_tensor_parallel_ranks_each_hold_their_share_of_the_slots():
    served = args(spec(model=FAMILY, adapters=[SQL], resources={"gpus": 2, "gpuMemory": "80Gi"}))
    assert "--enable-lora" in served and flag(served, "--tensor-parallel-size") == "2"
    arch = KNOWN_ARCHITECTURES["llama-3-8b"]
    # Per layer, B of q, k, v, gate and up and A of o and down halve; the rest stays whole.
    halved = (4096 + 1024 + 1024 + 14336 * 2) + (4096 + 14336)
    difference = lora_slot_bytes(arch, 4, 16) - lora_slot_bytes(arch, 4, 16, tensor_parallel_size=2)
    assert difference == 4 * 16 * (halved // 2) * 32 * 2


# ---- status ----------------------------------------------------------------------------------------

READY = AdapterDownload("Ready", "copied", rank=16)


def test_adapter_states_per_variant():
    s = spec(adapters=[SQL, TONE, LEGAL, {**SQL, "name": "wide", "rank": None}])
    downloads = {
        "sql": READY,
        "tone": AdapterDownload("Downloading", "42% of 80.0 MB"),
        "legal": AdapterDownload("Failed", "downloading s3://adapters/legal failed: NoSuchKey"),
        "wide": AdapterDownload("Ready", "copied", rank=64),
    }
    pods = [PodAdapters("p1", frozenset({"sql"})), PodAdapters("p2", frozenset({"sql"}))]
    states = {a.name: a for a in adapter_statuses(s, downloads, pods)}
    assert (states["sql"].state, states["sql"].message) == ("Loaded", "loaded in 2 of 2 ready pods")
    assert (states["tone"].state, states["tone"].message) == ("Downloading", "42% of 80.0 MB")
    assert states["legal"].state == "Failed" and "NoSuchKey" in states["legal"].message
    assert states["wide"].state == "Failed"
    assert "rank 64 is above the pods' maxLoraRank 16" in states["wide"].message


def test_a_refusal_or_a_silent_pod_shows():
    s = spec(adapters=[SQL])
    refused = [PodAdapters("p1", frozenset(), {"sql": "400: LoRA adapter 'sql' ... hidden size 4096"})]
    (state,) = adapter_statuses(s, {"sql": READY}, refused)
    assert state.state == "Failed" and state.message.startswith("pod p1: 400")
    silent = [PodAdapters("p1", frozenset({"sql"})), PodAdapters("p2", unreachable="did not answer")]
    (state,) = adapter_statuses(s, {"sql": READY}, silent)
    assert state.state == "Loading" and state.message == "loaded in 1 of 2 ready pods; pod p2: did not answer"
    (state,) = adapter_statuses(s, {"sql": READY}, [])
    assert (state.state, state.message) == ("Loading", "no ready pod yet")


def test_an_unreadable_api_key_shows_while_the_adapter_still_downloads():
    s = spec(adapters=[SQL, TONE])
    downloads = {"sql": READY, "tone": AdapterDownload("Downloading", "42% of 80.0 MB")}
    blocked = "the Secret api that runtime.apiKeySecretRef names is not in namespace ml: create it"
    states = {a.name: a for a in adapter_statuses(s, downloads, [], blocked)}
    assert (states["sql"].state, states["sql"].message) == ("Loading", blocked)
    assert states["tone"].state == "Downloading"
    assert states["tone"].message == f"42% of 80.0 MB; once copied it cannot be loaded yet: {blocked}"


def test_the_status_lists_adapters_under_each_variant():
    s = spec(adapters=[SQL], variants=[{"name": "bf16"}, {"name": "int4", "quantization": "int4"}])
    adapters = {
        "bf16": adapter_statuses(s, {"sql": READY}, [PodAdapters("p1", frozenset({"sql"}))]),
        "int4": adapter_statuses(s, {"sql": READY}, []),
    }
    status = first_status(plan_service(s), adapters=adapters)
    dumped = status.model_dump(mode="json", by_alias=True)
    assert [v["adapters"][0]["state"] for v in dumped["variants"]] == ["Loaded", "Loading"]
    assert next(c for c in status.conditions if c.type == "Degraded").status == "False"


def test_a_failed_adapter_degrades_the_service():
    s = spec(adapters=[SQL])
    failed = {"sql": AdapterDownload("Failed", "downloading hf://org/sql-lora failed: 401")}
    status = first_status(plan_service(s), adapters={"bf16": adapter_statuses(s, failed, [])})
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "AdapterFailed")
    assert degraded.message == "adapter sql in variant bf16: downloading hf://org/sql-lora failed: 401"


# ---- loading into pods -----------------------------------------------------------------------------


def test_sync_loads_unloads_and_replaces_adapters_in_a_pod():
    with FakeRuntime() as runtime:
        memory = PodMemory()
        found = sync_pod("p1", runtime.url, {"sql": "/adapters/a/model", "tone": "/adapters/b/model"}, memory)
        assert found.served == {"sql", "tone"} and runtime.adapters == {
            "sql": "/adapters/a/model",
            "tone": "/adapters/b/model",
        }
        runtime.calls.clear()
        sync_pod("p1", runtime.url, {"sql": "/adapters/a/model", "tone": "/adapters/b/model"}, memory)
        assert runtime.calls == []  # settled: nothing to do
        found = sync_pod(
            "p1", runtime.url, {"sql": "/adapters/c/model"}, memory
        )  # new revision, tone removed
        assert runtime.adapters == {"sql": "/adapters/c/model"} and found.served == {"sql"}
        assert runtime.calls == [
            ("/v1/unload_lora_adapter", "sql"),
            ("/v1/unload_lora_adapter", "tone"),
            ("/v1/load_lora_adapter", "sql"),
        ]


def test_a_new_revision_replaces_the_old_one_only_once_it_is_copied():
    with FakeRuntime() as runtime:
        memory = PodMemory()
        sync_pod("p1", runtime.url, {"sql": "/adapters/a/model"}, memory)
        sync_pod("p1", runtime.url, {}, memory, keep={"sql"})  # the new revision is still copying
        assert runtime.adapters == {"sql": "/adapters/a/model"}
        sync_pod("p1", runtime.url, {"sql": "/adapters/b/model"}, memory, keep={"sql"})
        assert runtime.adapters == {"sql": "/adapters/b/model"}


def test_a_restarted_operator_reads_the_revisions_the_pod_serves():
    """An operator restarted with no memory of its loads keeps what is current, replaces what is old."""
    with FakeRuntime() as runtime:
        sync_pod("p1", runtime.url, {"sql": "/adapters/a/model", "tone": "/adapters/b/model"}, PodMemory())
        runtime.calls.clear()
        wanted = {"sql": "/adapters/a/model", "tone": "/adapters/c/model"}
        found = sync_pod("p1", runtime.url, wanted, PodMemory())
        assert runtime.calls == [("/v1/unload_lora_adapter", "tone"), ("/v1/load_lora_adapter", "tone")]
        assert runtime.adapters == {"sql": "/adapters/a/model", "tone": "/adapters/c/model"}
        assert found.served == {"sql", "tone"}


def test_an_adapter_loaded_by_hand_is_unloaded_and_a_refusal_is_not_asked_again():
    refusal = "LoRA adapter 'sql': has rank 64, above --max-lora-rank 16; start the server with a larger one"
    with FakeRuntime(refuse={"/adapters/a/model": refusal}) as runtime:
        runtime.adapters["manual"] = "/tmp/x"
        memory = PodMemory()
        found = sync_pod("p1", runtime.url, {"sql": "/adapters/a/model"}, memory)
        assert runtime.adapters == {} and found.refused == {"sql": f"400: {refusal}"}
        runtime.calls.clear()
        assert sync_pod("p1", runtime.url, {"sql": "/adapters/a/model"}, memory).refused == found.refused
        assert runtime.calls == []


def test_a_pod_that_does_not_answer_is_reported_not_failed():
    with FakeRuntime() as runtime:
        url = runtime.url
    found = sync_pod("p1", url, {"sql": "/adapters/a/model"}, PodMemory())
    assert found.unreachable and "did not answer" in found.unreachable and not found.served


class FakeKube:
    """The calls adapter_cluster makes: Jobs, Secrets and Pods by name and label."""

    def __init__(
        self,
        jobs: dict[str, dict],
        pods: list[dict],
        job_pods: dict[str, list[dict]],
        secrets: dict[str, dict] | None = None,
    ):
        self.jobs, self.pods, self.job_pods, self.secrets = jobs, pods, job_pods, secrets or {}

    def get(self, kind, namespace, name):
        return {"Job": self.jobs, "Secret": self.secrets}[kind].get(name)

    def list(self, kind, namespace, selector):
        if selector.startswith("job-name="):
            return self.job_pods.get(selector.removeprefix("job-name="), [])
        return self.pods

    def log_tail(self, namespace, pod, container):
        return ""


def _pod(name: str, ip: str, variant: str, *, ready: bool = True, worker: str | None = None) -> dict:
    labels = {"pagoda.dev/inference-service": NAME, "pagoda.dev/variant": variant}
    if worker is not None:
        labels["leaderworkerset.sigs.k8s.io/worker-index"] = worker
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "status": {"podIP": ip, "conditions": [condition]},
    }


def _done_job(rank: int) -> tuple[dict, list[dict]]:
    job = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    message = json.dumps({"revision": REVISION, "adapter": {"rank": rank}})
    pod = {
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": "download", "state": {"terminated": {"message": message}}}],
        }
    }
    return job, [pod]


def test_every_ready_pod_of_every_variant_gets_the_adapters(monkeypatch):
    s = spec(adapters=[SQL, TONE], variants=[{"name": "bf16"}, {"name": "int4", "quantization": "int4"}])
    sql, tone = (adapter_cache.adapter_ref(a).name for a in s.adapters)
    sql_job, sql_pods = _done_job(16)
    kube = FakeKube({sql: sql_job, tone: {"status": {}}}, [], {sql: sql_pods})
    with FakeRuntime(host="127.0.0.2") as first:
        monkeypatch.setattr(adapter_cluster, "PORT", first.port)
        with FakeRuntime(host="127.0.0.3", port=first.port) as second:
            kube.pods = [
                _pod("a", "127.0.0.2", "bf16"),
                _pod("b", "127.0.0.3", "int4"),
                _pod("c", "127.0.0.4", "int4", ready=False),
                _pod("d", "127.0.0.5", "int4", worker="1"),
            ]
            adapter_cluster.sync_adapters(kube, s, NS, NAME)
            assert first.adapters == second.adapters == {"sql": adapter_cache.replica_path(s.adapters[0])}
            states = adapter_cluster.variant_adapters(s, NS, NAME)
            assert {v: [(a.name, a.state) for a in states[v]] for v in states} == {
                "bf16": [("sql", "Loaded"), ("tone", "Downloading")],
                "int4": [("sql", "Loaded"), ("tone", "Downloading")],
            }
            # The adapter is removed from the spec: unloaded from the running pods.
            fewer = spec(
                adapters=[TONE], variants=[{"name": "bf16"}, {"name": "int4", "quantization": "int4"}]
            )
            adapter_cluster.sync_adapters(kube, fewer, NS, NAME)
            assert first.adapters == second.adapters == {}
    adapter_cluster.forget(NS, NAME)


def test_with_an_api_key_the_adapters_wait_for_its_secret_and_then_load(monkeypatch):
    """A service whose pods demand a key: while its Secret is missing the status says so and nothing
    is called; once the Secret is there, the next sync sends its key and loads the adapter."""
    s = spec(adapters=[SQL], runtime={"apiKeySecretRef": {"name": "api", "key": "token"}})
    (sql,) = (adapter_cache.adapter_ref(a).name for a in s.adapters)
    sql_job, sql_pods = _done_job(16)
    kube = FakeKube({sql: sql_job}, [], {sql: sql_pods})
    with FakeRuntime(api_key="s3cret") as runtime:
        monkeypatch.setattr(adapter_cluster, "PORT", runtime.port)
        kube.pods = [_pod("a", "127.0.0.1", "bf16")]
        adapter_cluster.sync_adapters(kube, s, NS, NAME)
        ((state,),) = adapter_cluster.variant_adapters(s, NS, NAME).values()
        assert state.state == "Loading" and state.message.startswith(
            f"the Secret api that runtime.apiKeySecretRef names is not in namespace {NS}: create it"
        )
        assert runtime.calls == []
        assert adapter_cluster.unsettled(
            first_status(plan_service(s), adapters={"bf16": [state]}).model_dump(by_alias=True)
        )
        kube.secrets["api"] = {"data": {"token": base64.b64encode(b"s3cret\n").decode()}}
        adapter_cluster.sync_adapters(kube, s, NS, NAME)
        ((state,),) = adapter_cluster.variant_adapters(s, NS, NAME).values()
        assert (state.state, state.message) == ("Loaded", "loaded in 1 of 1 ready pods")
        assert runtime.adapters == {"sql": adapter_cache.replica_path(s.adapters[0])}
    adapter_cluster.forget(NS, NAME)
