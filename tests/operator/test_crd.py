"""The CRD: in sync with the models, structural, documented, validated; examples and install parse."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_schema import validate
from pagoda_operator.crd import build_crd, render_yaml
from pagoda_operator.models import InferenceServiceSpec
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import ModelArchitecture
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "inferenceservices.pagoda.dev.yaml"
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def _schema() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_models():
    assert CRD_FILE.read_text() == render_yaml(), "regenerate: python -m pagoda_operator.crd > " + str(
        CRD_FILE.relative_to(ROOT)
    )


def test_crd_is_a_valid_kubernetes_object():
    validate(yaml.safe_load(CRD_FILE.read_text()))


def _walk(schema: dict, path: str):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural_and_every_field_is_described():
    for path, node in _walk(_schema(), ""):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title"} & set(node), f"{path} is not structural"
        if path and path != ".metadata" and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description"


def test_cel_rules_cover_the_static_checks():
    rules = {
        r["rule"]: r["message"]
        for _, node in _walk(_schema(), "")
        for r in node.get("x-kubernetes-validations", [])
    }
    assert any("exists_one" in r and "name" in r for r in rules)
    assert "(has(self.min) ? self.min : 1) <= (has(self.max) ? self.max : 1)" in rules
    assert any(r == "self.metadata.name.size() <= 63" for r in rules)
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["variants"]["minItems"] == 1
    variant = spec["variants"]["items"]["properties"]
    assert variant["quantization"]["enum"] == ["auto", "none", "int8", "int4", "fp8", "awq", "gptq", "gguf"]
    assert variant["kvCacheDtype"]["enum"] == ["auto", "fp8"]
    assert spec["model"]["properties"]["source"]["pattern"].startswith("^(pvc://")
    assert all(message for message in rules.values())


def test_printer_columns_short_name_and_status_subresource():
    version = build_crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Variants",
        "Replicas",
        "Fits",
        "Model",
        "URL",
        "Cache",
        "Age",
    ]
    assert version["subresources"] == {"status": {}}
    assert build_crd()["spec"]["names"]["shortNames"] == ["infsvc"]
    status = _schema()["properties"]["status"]["properties"]
    for column in version["additionalPrinterColumns"]:
        head = column["jsonPath"].split(".")[1:3]
        if head[0] == "status":
            assert head[1].split("[")[0] in status


def test_defaults_in_the_crd_are_the_models_defaults():
    spec = _schema()["properties"]["spec"]["properties"]
    parsed = InferenceServiceSpec.model_validate(
        {"model": {"source": "file:///m"}, "variants": [{"name": "a"}]}
    )
    assert (
        spec["runtime"]["properties"]["startupTimeoutSeconds"]["default"]
        == parsed.runtime.startup_timeout_seconds
    )
    assert (
        spec["autoscaling"]["properties"]["targetQueueDepth"]["default"]
        == parsed.autoscaling.target_queue_depth
    )
    assert spec["drain"]["properties"]["timeoutSeconds"]["default"] == parsed.drain.timeout_seconds

    def defaults(node):
        yield from ([node["default"]] if "default" in node else [])
        for child in [*node.get("properties", {}).values(), *([node["items"]] if "items" in node else [])]:
            yield from defaults(child)

    # The apiserver fills nothing inside a list item, so that re-applying a file changes nothing.
    for path, node in _walk(_schema(), ""):
        if path.endswith("[]"):
            assert list(defaults(node)) == [], path
    assert spec["variants"]["x-kubernetes-list-type"] == "map"
    assert spec["variants"]["x-kubernetes-list-map-keys"] == ["name"]


def _crd_name(field_name: str) -> str:
    """A ModelArchitecture field's name in the CRD: camelCase, but for the layer count, which
    InferenceServices wrote as numLayers before the fields took Hugging Face's names."""
    return "numLayers" if field_name == "num_hidden_layers" else to_camel(field_name)


def test_the_crd_architecture_is_exactly_the_runtimes_model_architecture():
    """A shape field is added once, to ModelArchitecture: the CRD gets it, required where the
    dataclass has no default, and a spec's architecture sizes as that dataclass."""
    schema = _schema()["properties"]["spec"]["properties"]["model"]["properties"]["architecture"]
    fields = dataclasses.fields(ModelArchitecture)
    assert list(schema["properties"]) == [_crd_name(f.name) for f in fields]
    assert schema["required"] == [_crd_name(f.name) for f in fields if f.default is dataclasses.MISSING]
    for f in fields:
        prop = schema["properties"][_crd_name(f.name)]
        assert prop["description"] == f.metadata["description"]
        assert prop.get("minimum") == f.metadata.get("minimum"), f.name

    # As an InferenceService that sizes Qwen2.5-7B by its shape is written.
    written = {
        "numLayers": 28,
        "hiddenSize": 3584,
        "intermediateSize": 18944,
        "numAttentionHeads": 28,
        "numKeyValueHeads": 4,
        "headDim": 128,
        "vocabSize": 152064,
        "maxPositionEmbeddings": 32768,
        "attentionBias": True,
    }
    raw = {"model": {"source": "pvc://m/x", "architecture": written}, "variants": [{"name": "a"}]}
    parsed = InferenceServiceSpec.model_validate(raw)
    assert parsed.model.sizing_architecture() == KNOWN_ARCHITECTURES["qwen2.5-7b"]
    with pytest.raises(ValidationError, match="numLayers"):
        InferenceServiceSpec.model_validate(
            {**raw, "model": {**raw["model"], "architecture": {**written, "numLayers": 0}}}
        )
    with pytest.raises(ValidationError, match="numHiddenLayers"):
        InferenceServiceSpec.model_validate(
            {**raw, "model": {**raw["model"], "architecture": {**written, "numHiddenLayers": 28}}}
        )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_parse(path):
    for doc in yaml.safe_load_all(path.read_text()):
        assert doc["apiVersion"] == "pagoda.dev/v1alpha1" and doc["kind"] == "InferenceService"
        InferenceServiceSpec.model_validate(doc["spec"])


# Fields full.yaml leaves out, and why.
NOT_IN_FULL = {
    ".spec.scheduling.priorityClassName": "names a PriorityClass of the user's cluster (a comment shows it)",
    ".spec.model.s3.credentialsSecretName": "excludes serviceAccountName; s3-cache.yaml shows it",
    ".spec.model.architecture.slidingWindow": "Llama 3 attends to the whole context (a comment names it)",
    ".spec.model.architecture.attentionChunkSize": "Llama 3 attends to the whole context (as above)",
    ".spec.variants[].speculative.model.architecture.slidingWindow": "as the model's",
    ".spec.variants[].speculative.model.architecture.attentionChunkSize": "as the model's",
    ".spec.variants[].speculative.model.s3.credentialsSecretName": "as the model's",
}


def _paths(value, path: str = ""):
    if isinstance(value, dict):
        for key, child in value.items():
            yield f"{path}.{key}"
            yield from _paths(child, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{path}[]")


def test_full_example_shows_every_field():
    shown = {
        p
        for doc in yaml.safe_load_all((ROOT / "manifests/examples/full.yaml").read_text())
        for p in _paths(doc)
    }
    missing = []
    for path, _ in _walk(_schema()["properties"]["spec"], ".spec"):
        if path.endswith(("[]", "{}")) or path in shown or path in NOT_IN_FULL:
            continue
        missing.append(path)
    assert not missing, f"full.yaml lacks {missing}"


def test_examples_include_minimal_full_two_variants_and_cpu():
    names = {p.name for p in EXAMPLES}
    assert {"minimal.yaml", "full.yaml", "two-variants.yaml", "cpu-smollm2.yaml"} <= names
    cpu = yaml.safe_load((ROOT / "manifests/examples/cpu-smollm2.yaml").read_text())["spec"]
    assert cpu["resources"]["gpus"] == 0 and cpu["model"]["source"] == "bundled://smollm2-135m"


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"variants": []}, "at least 1"),
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"variants": [{"name": "a", "replicas": {"min": 3, "max": 2}}]}, "must not exceed"),
        ({"variants": [{"name": "a", "quantization": "int3"}]}, "int4"),
        ({"variants": [{"name": "a", "kvCacheDtype": "int8"}]}, "fp8"),
        ({"variants": [{"name": "a", "quantization": "gguf"}]}, "needs a GGUF model source"),
        (
            {
                "model": {"source": "file:///m/llama.Q4_0.gguf"},
                "variants": [{"name": "a", "quantization": "awq"}],
            },
            "not AWQ or GPTQ",
        ),
        ({"model": {"source": "gs://bucket/m"}}, "pattern"),
        ({"model": {"source": "hf://org/m"}}, "revision"),
        ({"model": {"source": "hf://org/m", "revision": "main"}}, "pattern"),
        ({"model": {"source": "pvc://m/x", "cache": {"size": "1Gi"}}}, "cache applies only"),
        ({"model": {"source": "hf://org/m", "revision": "a" * 40, "s3": {}}}, "s3 applies only"),
        ({"model": {"source": "pvc://m/x", "tokenSecretRef": {"name": "a", "key": "b"}}}, "hf://"),
        ({"model": {"source": "pvc://m/x", "family": "gpt-5"}}, "unknown family"),
    ],
)
def test_invalid_specs_are_refused_with_a_message(spec, message):
    raw = {"model": {"source": "pvc://m/x"}, "variants": [{"name": "a"}], **spec}
    with pytest.raises(ValidationError, match=message):
        InferenceServiceSpec.model_validate(raw)


def test_install_base_is_valid_and_lists_its_files():
    base = ROOT / "manifests"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        target = base / resource
        assert target.exists(), resource
        if target.is_file():
            for doc in yaml.safe_load_all(target.read_text()):
                validate(doc)
    deployment = yaml.safe_load((base / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "pagoda-operator"


def test_rbac_grants_what_the_operator_applies():
    rules = [
        d
        for d in yaml.safe_load_all((ROOT / "manifests/rbac.yaml").read_text())
        if d["kind"] == "ClusterRole"
    ]
    granted = {
        (g, r, v)
        for rule in rules[0]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for group, resource in [
        ("apps", "deployments"),
        ("", "services"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("policy", "poddisruptionbudgets"),
        ("monitoring.coreos.com", "servicemonitors"),
    ]:
        for verb in ("create", "patch", "list", "delete"):
            assert (group, resource, verb) in granted, (group, resource, verb)
    assert ("pagoda.dev", "inferenceservices/status", "patch") in granted
    # The Secret a service names for its API key is read by name; no Secret is listed or watched.
    assert {v for g, r, v in granted if (g, r) == ("", "secrets")} == {"get"}
    assert not any(v == "*" or r == "*" for _, r, v in granted)


def test_monitoring_assets_use_the_runtime_metrics():
    adapter = yaml.safe_load((ROOT / "manifests/monitoring/prometheus-adapter-rules.yaml").read_text())
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rules[0]["name"]["as"] == "pagoda_num_requests_waiting"
    assert set(rules[0]["resources"]["overrides"]) == {"namespace", "pod"}
    dashboard = json.loads((ROOT / "manifests/monitoring/grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "pagoda_num_requests_waiting",
        "pagoda_kv_cache_usage_ratio",
        "pagoda_time_to_first_token_seconds",
        "pagoda_generation_tokens_total",
        "pagoda_prefix_cache_hits_total",
    ):
        assert metric in exprs


def test_importing_the_operator_does_not_import_torch():
    code = (
        "import sys, pagoda_operator.cli, pagoda_operator.handlers, pagoda_operator.render, "
        "pagoda_operator.status, pagoda_operator.crd, pagoda_operator.kube, pagoda_operator.metrics;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
