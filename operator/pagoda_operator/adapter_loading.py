"""The adapters of spec.adapters in the running pods: loaded and unloaded through the runtime's API, as
vLLM's clients do it (POST /v1/load_lora_adapter {lora_name, lora_path}, POST /v1/unload_lora_adapter
{lora_name}), and read back from GET /v1/models, whose card of an adapter names its parent and, as
`root`, the path it was loaded from: the cache path holds the revision, so the pod itself says which
revision it serves, and an operator restarted with nothing in memory replaces only outdated copies.

The pod template never lists the adapters (render.py renders only --enable-lora and the limits), so
declaring or removing one restarts nothing: each ready pod is brought to the declared set, a new pod
as soon as it is ready. spec.adapters is the whole set: an adapter a pod serves that the spec does not
declare is unloaded. The runtime refuses an adapter that does not fit the model (400, its reason),
which the status shows as Failed without asking again; a pod that does not answer is asked again on
the next sync. A service with runtime.apiKeySecretRef demands its key on /v1 (as vLLM's --api-key):
every call carries it as `Authorization: Bearer <key>`, and a 401 (the pods started with another key)
is a pod to ask again, not a refusal of the adapter.

`sync_pod` makes the calls (stdlib HTTP: the operator has no other use for a client); the rest is pure.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from pagoda_operator.adapter_cache import AdapterDownload
from pagoda_operator.models import AdapterStatus, InferenceServiceSpec

READ_TIMEOUT_S = 5.0
# Loading reads the adapter's folder and builds its tensors; a large one takes seconds.
LOAD_TIMEOUT_S = 60.0


class PodUnreachable(Exception):
    """The pod did not answer (or not as a runtime does); asked again on the next sync."""


class Refused(Exception):
    """The runtime answered 4xx: the adapter cannot run there, for the reason given."""


def _call(url: str, body: dict | None, timeout: float, api_key: str | None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text.strip() or exc.reason
        if exc.code == 401:
            raise PodUnreachable(_unauthorized(url, api_key)) from exc
        if 400 <= exc.code < 500:
            raise Refused(f"{exc.code}: {message}") from exc
        raise PodUnreachable(f"{url} answered {exc.code}: {message}") from exc
    except (OSError, urllib.error.URLError) as exc:
        raise PodUnreachable(f"{url} did not answer: {exc}") from exc


def _unauthorized(url: str, api_key: str | None) -> str:
    if api_key:
        return (
            f"{url} answered 401 to the key in runtime.apiKeySecretRef's Secret: the pods read the key "
            "when they start, so restart them after changing the Secret"
        )
    return f"{url} answered 401: the pods demand an API key, so name its Secret in runtime.apiKeySecretRef"


def served_adapters(base_url: str, api_key: str | None = None) -> dict[str, str]:
    """The adapters the pod serves, name -> the path each was loaded from: the cards of GET
    /v1/models that name a parent, with their root."""
    try:
        cards = json.loads(_call(f"{base_url}/v1/models", None, READ_TIMEOUT_S, api_key))["data"]
        return {card["id"]: card["root"] for card in cards if card.get("parent")}
    except (ValueError, KeyError, TypeError) as exc:
        raise PodUnreachable(f"{base_url}/v1/models is not a model list: {exc}") from exc
    except Refused as exc:
        raise PodUnreachable(f"{base_url}/v1/models answered {exc}") from exc


def load_adapter(base_url: str, name: str, path: str, api_key: str | None) -> None:
    body = {"lora_name": name, "lora_path": path}
    _call(f"{base_url}/v1/load_lora_adapter", body, LOAD_TIMEOUT_S, api_key)


def unload_adapter(base_url: str, name: str, api_key: str | None) -> None:
    try:
        _call(f"{base_url}/v1/unload_lora_adapter", {"lora_name": name}, READ_TIMEOUT_S, api_key)
    except Refused as exc:
        if not str(exc).startswith("404"):  # gone already: what was asked
            raise


@dataclass
class PodMemory:
    """The loads the runtime refused in one pod (kept while the pod lives), which are not asked
    again; a restarted operator asks once more and hears the same reason."""

    refused: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodAdapters:
    """One ready pod's adapters after a sync."""

    pod: str
    served: frozenset[str] = frozenset()
    refused: Mapping[str, str] = field(default_factory=dict)  # adapter -> the runtime's reason
    unreachable: str | None = None


def sync_pod(
    pod: str,
    base_url: str,
    wanted: Mapping[str, str],
    memory: PodMemory,
    keep: Collection[str] = (),
    api_key: str | None = None,
) -> PodAdapters:
    """Brings the pod at `base_url` to serve exactly `wanted` (adapter name -> lora_path). `keep`:
    adapters declared but not ready to load (a new revision still copying): what the pod serves
    under those names stays until the new copy replaces it. `api_key`: the key the pod demands."""
    try:
        served = served_adapters(base_url, api_key)
        for name, loaded_from in sorted(served.items()):
            if name in keep and name not in wanted:
                continue
            # Not declared, or loaded from another revision's copy (or by hand, from elsewhere).
            if wanted.get(name) != loaded_from:
                unload_adapter(base_url, name, api_key)
                del served[name]
        refused = {}
        for name, path in sorted(wanted.items()):
            if name in served:
                continue
            if (name, path) in memory.refused:
                refused[name] = memory.refused[(name, path)]
                continue
            try:
                load_adapter(base_url, name, path, api_key)
            except Refused as exc:
                refused[name] = memory.refused[(name, path)] = str(exc)
                continue
            served[name] = path
    except (PodUnreachable, Refused) as exc:
        return PodAdapters(pod, unreachable=str(exc))
    return PodAdapters(pod, frozenset(served), refused)


def wanted_adapters(
    spec: InferenceServiceSpec, downloads: Mapping[str, AdapterDownload], paths: Mapping[str, str]
) -> dict[str, str]:
    """The adapters the pods should serve, by name -> lora_path: those copied into the cache whose
    rank the pods' slots take (an unknown rank is left to the runtime to check)."""
    return {
        a.name: paths[a.name]
        for a in spec.adapters
        if (d := downloads.get(a.name)) is not None
        and d.phase == "Ready"
        and (d.rank is None or d.rank <= spec.max_lora_rank)
    }


def adapter_statuses(
    spec: InferenceServiceSpec,
    downloads: Mapping[str, AdapterDownload],
    pods: list[PodAdapters],
    blocked: str | None = None,
) -> list[AdapterStatus]:
    """Each declared adapter's state in one variant whose ready pods are `pods`. `blocked`: why the
    last sync could not call the pods at all (their API key could not be read)."""
    out = []
    for adapter in spec.adapters:
        name = adapter.name
        download = downloads.get(name) or AdapterDownload("Downloading", "its download Job is being created")
        if download.phase == "Downloading" and blocked is not None:
            # Said now, so that the Secret is fixed while the copy runs rather than after it.
            message = f"{download.message}; once copied it cannot be loaded yet: {blocked}"
            out.append(AdapterStatus(name=name, state=download.phase, message=message))
            continue
        if download.phase != "Ready":
            out.append(AdapterStatus(name=name, state=download.phase, message=download.message))
            continue
        if download.rank is not None and download.rank > spec.max_lora_rank:
            out.append(
                AdapterStatus(
                    name=name,
                    state="Failed",
                    message=f"its rank {download.rank} is above the pods' maxLoraRank {spec.max_lora_rank}: "
                    f"set runtime.maxLoraRank (or adapters[].rank) to at least {download.rank}; new pods "
                    "start with the larger slots",
                )
            )
            continue
        if blocked is not None:
            out.append(AdapterStatus(name=name, state="Loading", message=blocked))
            continue
        refusals = [f"pod {p.pod}: {p.refused[name]}" for p in pods if name in p.refused]
        if refusals:
            out.append(AdapterStatus(name=name, state="Failed", message="; ".join(refusals)))
            continue
        loaded = sum(name in p.served for p in pods)
        unreachable = [f"pod {p.pod}: {p.unreachable}" for p in pods if p.unreachable]
        if pods and loaded == len(pods):
            message = f"loaded in {loaded} of {len(pods)} ready pods"
            out.append(AdapterStatus(name=name, state="Loaded", message=message))
        else:
            message = f"loaded in {loaded} of {len(pods)} ready pods" if pods else "no ready pod yet"
            out.append(AdapterStatus(name=name, state="Loading", message="; ".join([message, *unreachable])))
    return out
