"""What GitOps tools make of an InferenceService's status: Argo CD through the health script of
docs/gitops/argocd-cm.yaml (run by a Lua 5.1 interpreter, the language of Argo CD's gopher-lua), and
Flux through kstatus itself (kstatus-check, built from sigs.k8s.io/cli-utils). The statuses are the
operator's own, computed from Deployments and Pods in each state."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from lupa import lua51
from pagoda_operator.model_cache import CacheStatus
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.names import variant_object_name
from pagoda_operator.plan import plan_service
from pagoda_operator.status import compute_status, invalid_status, status_patch

from tests.repo_modules import ROOT, controlplane

NS, NAME, T0 = "ml", "chat", "2026-01-01T00:00:00Z"
SPEC = {"model": {"source": "pvc://models/llama", "family": "llama-3-8b"}, "variants": [{"name": "bf16"}]}
HF = {"source": "hf://acme/llama", "revision": "0" * 40, "family": "llama-3-8b"}


def _deployment(*, ready: int, updated: int = 1) -> dict:
    return {
        "metadata": {"name": variant_object_name(NAME, "bf16"), "generation": 2},
        "spec": {"replicas": 1},
        "status": {
            "replicas": 1,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": 2,
        },
    }


def _crash_looping_pod() -> dict:
    state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}
    last = {"terminated": {"exitCode": 1, "message": "CUDA driver version is insufficient"}}
    return {
        "metadata": {"name": f"{NAME}-bf16-abc", "labels": {"pagoda.dev/variant": "bf16"}},
        "status": {"containerStatuses": [{"name": "runtime", "state": state, "lastState": last}]},
    }


def _status(deployments, pods=(), model=None, cache=None) -> dict:
    spec = InferenceServiceSpec.model_validate({**SPEC, **({"model": model} if model else {})})
    return compute_status(
        plan_service(spec),
        namespace=NS,
        name=NAME,
        generation=3,
        deployments=deployments,
        pods=list(pods),
        previous=None,
        now=T0,
        cache=cache,
    )


def _object(status: dict | None, generation: int = 3) -> dict:
    obj = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS, "generation": generation},
        "spec": SPEC,
    }
    if status is not None:
        # As stored: the merge patch the operator writes (a typed status is turned into one).
        obj["status"] = status if isinstance(status, dict) else status_patch(status)
    return obj


# (Argo CD health, kstatus status, a word the message must hold) per state.
STATES = {
    "created, not yet seen": (_object(None), "Progressing", "InProgress", "operator"),
    "an older generation's status": (
        _object(_status([_deployment(ready=1)]), generation=4),
        "Progressing",
        "InProgress",
        "generation 4",
    ),
    "model loading": (_object(_status([_deployment(ready=0)])), "Progressing", "InProgress", "Starting"),
    "model downloading": (
        _object(
            _status(
                [],
                model=HF,
                cache=CacheStatus("pagoda-model-x", "Downloading", "3 GB of 16 GB", progress=18),
            )
        ),
        "Progressing",
        "InProgress",
        "Downloading 18%",
    ),
    "crash looping": (
        _object(_status([_deployment(ready=0)], [_crash_looping_pod()])),
        "Degraded",
        "Failed",
        "CUDA driver version is insufficient",
    ),
    "invalid spec": (
        _object(
            invalid_status(None, reason="InvalidSpec", message="spec.variants: bad", generation=3, now=T0)
        ),
        "Degraded",
        "Failed",
        "InvalidSpec",
    ),
    "rolling out while serving": (
        _object(_status([{**_deployment(ready=1, updated=0)}])),
        "Progressing",
        "InProgress",
        "RollingOut",
    ),
    "serving": (_object(_status([_deployment(ready=1)])), "Healthy", "Current", "serving at"),
}


def _argo_script() -> str:
    config_map = yaml.safe_load((ROOT / "docs" / "gitops" / "argocd-cm.yaml").read_text())
    return config_map["data"]["resource.customizations.health.pagoda.dev_InferenceService"]


def argo_health(obj: dict) -> dict:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    # Argo CD hands the script the object as Lua tables (arrays indexed from 1), as table_from does.
    lua.globals().obj = _lua_value(lua, obj)
    result = lua.execute(_argo_script())
    return {"status": result["status"], "message": result["message"]}


def _lua_value(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: _lua_value(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_lua_value(lua, v) for v in value])
    return value


@pytest.mark.parametrize("state", list(STATES))
def test_argo_cd_health(state):
    obj, health, _, word = STATES[state]
    result = argo_health(obj)
    assert result["status"] == health, result
    assert word in result["message"], result


def _kstatus_check() -> str:
    path = controlplane.binary_path("kstatus-check")
    if not path.exists():
        if shutil.which("go") is None:
            pytest.skip(
                "kstatus-check is not built and Go is not on PATH (e2e/controlplane/build.sh kstatus-check)"
            )
        controlplane.ensure_binaries(("kstatus-check",))
    return str(path)


def test_flux_kstatus_reads_the_status_as_it_is():
    names = list(STATES)
    lines = "".join(json.dumps(STATES[n][0]) + "\n" for n in names)
    done = subprocess.run([_kstatus_check()], input=lines, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    expected = {n: STATES[n][2] for n in names}
    # kstatus's rule for an object with no status at all: Current. The operator writes one on its
    # first reconcile (within a second of the apply); until then Flux cannot tell, and says so here.
    expected["created, not yet seen"] = "Current"
    assert {n: r["status"] for n, r in zip(names, results, strict=True)} == expected
    failed = results[names.index("crash looping")]
    assert "CUDA driver version is insufficient" in failed["message"]
