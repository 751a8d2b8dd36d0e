"""InferenceService → the child manifests that serve it. Pure: no I/O, same input, same output.

Per variant: a Deployment (a LeaderWorkerSet when a replica spans nodes), a Service, a
PodDisruptionBudget and (when it autoscales) a KEDA ScaledObject (scaled_object.py) or an HPA on
queue depth. Over all variants: one Service, an HTTPRoute with spec.route (http_route.py), and a
ServiceMonitor when Prometheus Operator is installed. A variant whose model cannot
fit its pods gets no workload at all: pods that can only crash-loop help nobody, and the status says
why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.flags import default_of, option, to_args
from pagoda_runtime.contract.names import (
    API_KEY_ENV,
    DISTRIBUTED_PORT,
    LIVE_PATH,
    METRICS_PATH,
    READY_PATH,
    REQUESTS_WAITING,
    TERMINATION_LOG,
)
from pagoda_runtime.contract.serve_settings import DistributedSettings, ServerSettings
from pagoda_runtime.contract.sources import parse_pvc

from pagoda_operator import adapter_cache, model_cache
from pagoda_operator.http_route import http_route, rules_reaching
from pagoda_operator.leader_worker_set import LEADER_SELECTOR, LWS_API_VERSION, LWS_KIND, leader_worker_set
from pagoda_operator.models import GROUP, KIND, VERSION, InferenceServiceSpec, ModelSpec, VariantSpec
from pagoda_operator.names import (
    DEFAULT_OPERATOR_NAMESPACE,
    LABEL_ISVC,
    LABEL_VARIANT,
    NAMESPACE_NAME_LABEL,
    OPERATOR_POD_LABELS,
    PORT,
    labels,
    selector_labels,
    variant_model_names,
    variant_object_name,
    workload_name,
)
from pagoda_operator.plan import ServicePlan, VariantPlan
from pagoda_operator.scaled_object import KedaSettings, scaled_object
from pagoda_operator.scaling_behavior import behavior
from pagoda_operator.settings import DEFAULT_RUNTIME_IMAGE

RUNTIME_CONTAINER = "runtime"
RUNTIME_UID = 10001  # the user images/runtime.Dockerfile creates
MODEL_MOUNT = "/models"
# A variant's speculative-decoding draft model: its volume, where it is mounted, and the init
# container that holds the pod until its cache is filled.
DRAFT_VOLUME = "draft"
DRAFT_MOUNT = "/draft"
DRAFT_WAIT_CONTAINER = "wait-for-draft"
CACHE_MOUNT = "/cache"
SHUTDOWN_MARGIN_SECONDS = 15
PROBE_PERIOD_SECONDS = 10
# The startup probe runs only until the pod is ready once, so a short period costs little and lets
# the Ready condition (and the Service's endpoints) follow /health/ready within a second.
STARTUP_PROBE_PERIOD_SECONDS = 1
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class RenderOptions:
    service_monitor: bool = False  # whether the monitoring.coreos.com CRD exists
    gateway_api: bool = False  # whether the Gateway API's HTTPRoute CRD exists
    # KEDA scales the autoscaled variants (its CRDs exist, and autoscaling.actuator is not hpa).
    keda: KedaSettings | None = None
    runtime_image: str = DEFAULT_RUNTIME_IMAGE  # for a spec that names none (settings.py)
    service_monitor_labels: tuple[tuple[str, str], ...] = ()
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE  # whose operator pods load adapters


def with_runtime_image(spec: InferenceServiceSpec, options: RenderOptions) -> InferenceServiceSpec:
    """The spec with its own runtime image, else the operator's default: what every pod and Job runs."""
    if spec.runtime.image:
        return spec
    return spec.model_copy(
        update={"runtime": spec.runtime.model_copy(update={"image": options.runtime_image})}
    )


def _metadata(object_name: str, namespace: str, name: str, uid: str, variant: str | None) -> dict:
    return {
        "name": object_name,
        "namespace": namespace,
        "labels": labels(name, variant),
        "ownerReferences": [
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": name,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _model_argument(model: ModelSpec, mount: str) -> str:
    scheme, rest = model.source.split("://", 1)
    if scheme == "pvc":
        return parse_pvc(model.source).under(mount)
    if scheme in ("hf", "s3"):
        return model_cache.replica_model_path(mount)
    return rest  # file:///x keeps its leading slash; bundled://name is the runtime's own name


def _speculative_args(variant: VariantSpec) -> list[str]:
    """--speculative-config in vLLM's JSON; a draft model by the path its volume is mounted at."""
    speculative = variant.speculative
    if speculative is None:
        return []
    config = {"method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens}
    if speculative.prompt_lookup_max is not None:
        config["prompt_lookup_max"] = speculative.prompt_lookup_max
    if speculative.prompt_lookup_min is not None:
        config["prompt_lookup_min"] = speculative.prompt_lookup_min
    if (draft := speculative.draft) is not None:
        config["model"] = _model_argument(draft, DRAFT_MOUNT)
    return [option(EngineConfig, "speculative_config"), json.dumps(config)]


# The serve flags every pod gets, in the order they have always been rendered in (a reordering
# would change every pod template, and so restart every replica on an operator upgrade).
_SERVE_ARGS = (
    "model",
    "served_model_names",
    "host",
    "port",
    "device",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_memory",
    "enable_prefix_caching",
    "max_queue",
)
_GROUP_ARGS = ("tensor_parallel_size", "distributed_port")  # only where a replica has several ranks
# Only where the pods serve LoRA; the adapters themselves are loaded through the runtime's API
# (adapter_loading.py), so that the set of adapters is no part of the pod template.
_LORA_ARGS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")
_LAST_ARGS = ("drain_timeout", "termination_log", "log_format", "metrics_compat")
# Only where set to something but its default (which every earlier pod template leaves out).
_RUNNER_ARGS = ("runner",)


def runtime_args(spec: InferenceServiceSpec, variant: VariantSpec, served_name: str) -> list[str]:
    """`pagoda-runtime serve` and its flags, written by the runtime's own settings types; a setting
    that is unset (max_model_len, max_queue) is left to the runtime's default."""
    rt = spec.runtime
    engine = EngineConfig(
        model=_model_argument(spec.model, MODEL_MOUNT),
        device="cuda" if spec.resources.gpus else "cpu",
        dtype=rt.dtype,
        quantization=variant.quantization,
        kv_cache_dtype=variant.kv_cache_dtype,
        max_model_len=spec.model.max_model_len,
        max_num_seqs=rt.max_num_seqs,
        max_num_batched_tokens=rt.max_num_batched_tokens,
        block_size=rt.block_size,
        kv_cache_memory=rt.kv_cache_memory,
        enable_prefix_caching=rt.enable_prefix_caching,
        runner=rt.runner,
        tensor_parallel_size=spec.tensor_parallel_size,
        enable_lora=spec.lora_enabled,
        max_loras=rt.max_loras,
        max_lora_rank=spec.max_lora_rank,
        max_cpu_loras=rt.max_cpu_loras,
    )
    server = ServerSettings(
        served_model_names=variant_model_names(served_name, variant.name),
        port=PORT,
        max_queue=rt.max_queue,
        drain_timeout=spec.drain.timeout_seconds,
        termination_log=TERMINATION_LOG,
        log_format=rt.log_format,
        # Dashboards and autoscaling rules written for vLLM work unchanged; pagoda_* stay.
        metrics_compat="vllm",
    )
    group = _GROUP_ARGS if spec.tensor_parallel_size > 1 else ()
    lora = _LORA_ARGS if spec.lora_enabled else ()
    runner = _RUNNER_ARGS if rt.runner != default_of(EngineConfig, "runner") else ()
    return [
        "serve",
        *to_args(_SERVE_ARGS, engine, server, DistributedSettings()),
        *_speculative_args(variant),
        *to_args(group + lora + runner + _LAST_ARGS, engine, server, DistributedSettings()),
        *rt.extra_args,
    ]


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
}
POD_SECURITY = model_cache.PodSecurity(
    pod={
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        "fsGroup": RUNTIME_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    container=_CONTAINER_SECURITY,
)


def _resources(spec: InferenceServiceSpec) -> dict:
    res = spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu is not None:
        requests["cpu"] = str(res.cpu)
    if res.memory is not None:
        requests["memory"] = limits["memory"] = str(res.memory)
    if res.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(res.gpus)
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _http_probe(path: str, period: int, failures: int, timeout: int) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _runtime_container(
    spec: InferenceServiceSpec, variant: VariantSpec, served_name: str, *, serves: bool
) -> dict:
    """serves: the pod that serves HTTP (every pod of a Deployment, a group's leader); a worker pod
    only computes its ranks, has no HTTP port for a Service to route to, and no HTTP probes."""
    rt = spec.runtime
    env = [
        {"name": "HOME", "value": CACHE_MOUNT},
        {"name": "XDG_CACHE_HOME", "value": CACHE_MOUNT},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_MOUNT}/triton"},
    ]
    if rt.api_key_secret_ref is not None:
        ref = rt.api_key_secret_ref
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env += [{"name": e.name, "value": e.value} for e in rt.env]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    if spec.model.scheme in ("pvc", "hf", "s3"):
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    draft = model_cache.draft_spec(spec, variant)
    if draft is not None and draft.model.scheme in ("pvc", "hf", "s3"):
        mounts.append({"name": DRAFT_VOLUME, "mountPath": DRAFT_MOUNT, "readOnly": True})
    if spec.lora_enabled:
        mounts.append(adapter_cache.replica_mount())
    container = {
        "name": RUNTIME_CONTAINER,
        "image": rt.image,
        "imagePullPolicy": rt.image_pull_policy,
        "command": ["pagoda-runtime"],
        "args": runtime_args(spec, variant, served_name),
        "env": env,
        "resources": _resources(spec),
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _CONTAINER_SECURITY,
    }
    if not serves:
        return container
    container["ports"] = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
    if spec.spans_nodes:
        # The group's other pods join rank 0's store here.
        container["ports"].append(
            {"name": "distributed", "containerPort": DISTRIBUTED_PORT, "protocol": "TCP"}
        )
    # Model loading can take many minutes; liveness only starts once the pod was ready once. A
    # group's leader is ready only once every rank of the group has joined.
    container["startupProbe"] = _http_probe(
        READY_PATH,
        STARTUP_PROBE_PERIOD_SECONDS,
        math.ceil(rt.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS),
        5,
    )
    container["readinessProbe"] = _http_probe(READY_PATH, 5, 2, 3)
    # A busy engine still beats its heartbeat; a minute of silence means it is stuck.
    container["livenessProbe"] = _http_probe(LIVE_PATH, PROBE_PERIOD_SECONDS, 6, 5)
    if spec.drain.endpoint_removal_seconds:
        # The runtime drains on SIGTERM; keep serving until endpoints controllers and load
        # balancers have stopped routing here, or requests arriving meanwhile get a 503.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": spec.drain.endpoint_removal_seconds}}}
    return container


def _model_volume(spec: InferenceServiceSpec, name: str) -> list[dict]:
    """The volume the model of `spec` is read from: its own claim, or the cache it is downloaded into."""
    model = spec.model
    if model.scheme == "pvc":
        claim = parse_pvc(model.source).claim
        return [{"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}]
    if (ref := model_cache.cache_ref(spec)) is not None:
        return [model_cache.replica_volume(ref, name)]
    return []


def _volumes(spec: InferenceServiceSpec, variant: VariantSpec) -> list[dict]:
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        *_model_volume(spec, "model"),
    ]
    if (draft := model_cache.draft_spec(spec, variant)) is not None:
        volumes += _model_volume(draft, DRAFT_VOLUME)
    if spec.lora_enabled:
        volumes.append(adapter_cache.replica_volume())
    return volumes


def pod_tolerations(spec: InferenceServiceSpec) -> list[dict]:
    """The spec's tolerations, and the GPU nodes' taint for GPU pods (the model download Job's too)."""
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.scheduling.tolerations]
    if spec.resources.gpus:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def _gpu_product_affinity(spec: InferenceServiceSpec) -> dict:
    """gpuProduct as a node affinity: preferred, since only NVIDIA's GPU feature discovery sets the
    label and a cluster without it would never schedule a required one; required when asked."""
    res = spec.resources
    if not (res.gpus and res.gpu_product) or res.gpu_product_required:
        return {}
    term = {"matchExpressions": [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [res.gpu_product]}]}
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]
        }
    }


def _pod_spec(spec: InferenceServiceSpec, variant: VariantSpec, served_name: str, *, serves: bool) -> dict:
    sched = spec.scheduling
    node_selector = dict(sched.node_selector)
    tolerations = pod_tolerations(spec)
    if spec.resources.gpus and spec.resources.gpu_product and spec.resources.gpu_product_required:
        node_selector[GPU_PRODUCT_LABEL] = spec.resources.gpu_product
    affinity = _gpu_product_affinity(spec)
    pod = {
        "securityContext": POD_SECURITY.pod,
        "enableServiceLinks": False,
        # The runtime never calls the Kubernetes API; a token in the pod would only be a risk.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": (
            spec.drain.endpoint_removal_seconds + spec.drain.timeout_seconds + SHUTDOWN_MARGIN_SECONDS
        ),
        "containers": [_runtime_container(spec, variant, served_name, serves=serves)],
        "volumes": _volumes(spec, variant),
    }
    waits = []
    if (ref := model_cache.cache_ref(spec)) is not None:
        waits.append(model_cache.wait_container(spec, MODEL_MOUNT, POD_SECURITY))
        if model_cache.shares_one_node(spec):
            affinity.update(model_cache.same_node_affinity(ref))
    draft = model_cache.draft_spec(spec, variant)
    if draft is not None and model_cache.cache_ref(draft) is not None:
        waits.append(
            model_cache.wait_container(
                draft, DRAFT_MOUNT, POD_SECURITY, volume=DRAFT_VOLUME, name=DRAFT_WAIT_CONTAINER
            )
        )
    if waits:
        pod["initContainers"] = waits
    if affinity:
        pod["affinity"] = affinity
    if node_selector:
        pod["nodeSelector"] = node_selector
    if tolerations:
        pod["tolerations"] = tolerations
    if sched.priority_class_name:
        pod["priorityClassName"] = sched.priority_class_name
    if spec.runtime.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in spec.runtime.image_pull_secrets]
    return pod


def _with_overrides(pod: dict, spec: InferenceServiceSpec) -> dict:
    """spec.podTemplate.spec merged over the rendered pod: lists extended, the other fields set."""
    extra = spec.pod_template.spec
    (container,) = pod["containers"]
    dump = lambda items: [item.model_dump(by_alias=True, exclude_none=True) for item in items]  # noqa: E731
    container["env"] = container["env"] + dump(extra.env)
    container["volumeMounts"] = container["volumeMounts"] + dump(extra.volume_mounts)
    pod["volumes"] = pod["volumes"] + dump(extra.volumes)
    if extra.affinity is not None:
        pod["affinity"] = extra.affinity
    if extra.topology_spread_constraints:
        pod["topologySpreadConstraints"] = list(extra.topology_spread_constraints)
    if extra.runtime_class_name:
        pod["runtimeClassName"] = extra.runtime_class_name
    return pod


def _pod_template(
    spec: InferenceServiceSpec, variant: VariantSpec, served_name: str, name: str, *, serves: bool
):
    return {
        "metadata": {
            "labels": {
                **spec.pod_template.metadata.labels,
                **labels(name, variant.name),
                **model_cache.pod_labels(spec),
            },
            "annotations": {
                **spec.pod_template.metadata.annotations,
                "kubectl.kubernetes.io/default-container": RUNTIME_CONTAINER,
                **(
                    {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": METRICS_PATH,
                    }
                    if serves
                    else {}
                ),
            },
        },
        "spec": _with_overrides(_pod_spec(spec, variant, served_name, serves=serves), spec),
    }


def _deployment(spec, plan: VariantPlan, *, namespace, name, uid, served_name) -> dict:
    variant = plan.variant
    object_name = variant_object_name(name, variant.name)
    deployment_spec = {
        "selector": {"matchLabels": selector_labels(name, variant.name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": spec.rollout.strategy(spec.resources.gpus)},
        # Loading a model may take the whole startup timeout; only then is a rollout stuck.
        "progressDeadlineSeconds": spec.runtime.startup_timeout_seconds + 300,
        "template": _pod_template(spec, variant, served_name, name, serves=True),
    }
    # spec.replicas is left out: a field manager of its own owns it (replicas.py).
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(object_name, namespace, name, uid, variant.name),
        "spec": deployment_spec,
    }


def _leader_worker_set(spec, plan: VariantPlan, *, namespace, name, uid, served_name) -> dict:
    variant = plan.variant
    return leader_worker_set(
        _metadata(workload_name(name, variant.name, spans_nodes=True), namespace, name, uid, variant.name),
        size=spec.parallelism.nodes,
        leader_template=_pod_template(spec, variant, served_name, name, serves=True),
        worker_template=_pod_template(spec, variant, served_name, name, serves=False),
        rolling_update=spec.rollout.strategy(spec.resources.gpus),
    )


def _service(object_name, selector, *, namespace, name, uid, variant) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(object_name, namespace, name, uid, variant),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _hpa(spec, variant, *, namespace, name, uid) -> dict:
    object_name = variant_object_name(name, variant.name)
    scaling = spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(object_name, namespace, name, uid, variant.name),
        "spec": {
            # A LeaderWorkerSet scales by groups, and its scale subresource selects the leaders.
            "scaleTargetRef": (
                {
                    "apiVersion": LWS_API_VERSION,
                    "kind": LWS_KIND,
                    "name": workload_name(name, variant.name, spans_nodes=True),
                }
                if spec.spans_nodes
                else {"apiVersion": "apps/v1", "kind": "Deployment", "name": object_name}
            ),
            "minReplicas": variant.replicas.min,
            "maxReplicas": variant.replicas.max,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": REQUESTS_WAITING},
                        "target": {"type": "AverageValue", "averageValue": str(scaling.target_queue_depth)},
                    },
                }
            ],
            "behavior": behavior(scaling),
        },
    }


def _pdb(variant, *, namespace, name, uid) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(variant_object_name(name, variant.name), namespace, name, uid, variant.name),
        "spec": {
            # One pod at a time: node drains proceed, capacity never drops by more than one pod. Over
            # a LeaderWorkerSet it selects leaders and workers alike: any pod's loss restarts its whole
            # group, so one pod at a time is one group at a time, and a worker is covered too.
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(name, variant.name)},
            # A pod that is not serving anyway must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _service_monitor(spec, extra_labels: dict[str, str], *, namespace, name, uid) -> dict:
    metadata = _metadata(name, namespace, name, uid, None)
    # The operator's own labels win: they select the children it prunes.
    metadata["labels"] = {**extra_labels, **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata,
        "spec": {
            # The variant Services only: the all-variant Service would scrape every pod twice.
            "selector": {
                "matchLabels": selector_labels(name),
                "matchExpressions": [{"key": LABEL_VARIANT, "operator": "Exists"}],
            },
            "endpoints": [{"port": "http", "path": METRICS_PATH, "interval": spec.monitoring.interval}],
            # Series labelled by InferenceService and variant (PROMETHEUS_ISVC_LABEL, ..._VARIANT_LABEL).
            "podTargetLabels": [LABEL_ISVC, LABEL_VARIANT],
        },
    }


def _network_policy(spec, operator_namespace: str, *, namespace, name, uid) -> dict:
    policy = spec.network_policy
    clients = [{"podSelector": {"matchLabels": dict(policy.client_pod_labels)}}]
    if policy.client_namespace_labels is not None:
        clients.append({"namespaceSelector": {"matchLabels": dict(policy.client_namespace_labels)}})
    prometheus = {"namespaceSelector": {"matchLabels": dict(policy.prometheus_namespace_labels)}}
    # The operator loads and unloads adapters through the runtime's API (adapter_loading.py).
    operator = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
        "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
    }
    http_clients = [*clients, prometheus, *([operator] if spec.lora_enabled else [])]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(name, namespace, name, uid, None),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": http_clients, "ports": [{"protocol": "TCP", "port": PORT}]},
                # The ranks of a group in several pods reach each other on the distributed port
                # and on the ports NCCL or gloo pick at run time.
                *(
                    [{"from": [{"podSelector": {"matchLabels": selector_labels(name)}}]}]
                    if spec.spans_nodes
                    else []
                ),
            ],
        },
    }


def render(plan: ServicePlan, *, namespace: str, name: str, uid: str, options: RenderOptions) -> list[dict]:
    """Every child that should exist; Deployments and LeaderWorkerSets without spec.replicas (see
    replicas.py)."""
    spec = with_runtime_image(plan.spec, options)
    served_name = spec.model.served_name or name
    ids = {"namespace": namespace, "name": name, "uid": uid}
    objects = [_service(name, selector_labels(name), variant=None, **ids)]
    for variant_plan in plan.servable:
        variant = variant_plan.variant
        object_name = variant_object_name(name, variant.name)
        workload = _leader_worker_set if spec.spans_nodes else _deployment
        objects.append(workload(spec, variant_plan, served_name=served_name, **ids))
        # Workers expose no HTTP port, so no Service routes to them; this one says it outright.
        leaders = LEADER_SELECTOR if spec.spans_nodes else {}
        objects.append(
            _service(
                object_name, {**selector_labels(name, variant.name), **leaders}, variant=variant.name, **ids
            )
        )
        objects.append(_pdb(variant, **ids))
        if variant_plan.autoscales and options.keda is not None:
            metadata = _metadata(object_name, namespace, name, uid, variant.name)
            objects.append(
                scaled_object(
                    spec,
                    variant_plan,
                    metadata=metadata,
                    namespace=namespace,
                    name=name,
                    settings=options.keda,
                    route_rules=rules_reaching(plan, variant.name),
                )
            )
        elif variant_plan.autoscales:
            objects.append(_hpa(spec, variant, **ids))
    if spec.route is not None and options.gateway_api:
        objects.append(
            http_route(
                plan, metadata=_metadata(name, namespace, name, uid, None), name=name, served_name=served_name
            )
        )
    if spec.network_policy.enabled:
        objects.append(_network_policy(spec, options.operator_namespace, **ids))
    if options.service_monitor and spec.monitoring.service_monitor:
        objects.append(_service_monitor(spec, dict(options.service_monitor_labels), **ids))
    return objects
