"""The InferenceService CustomResourceDefinition, generated from the pydantic models.

Generating keeps the apiserver's schema and the operator's parser from drifting apart: a test
regenerates it and compares with crds/inferenceservices.pagoda.dev.yaml. Write it with
`python -m pagoda_operator.crd > crds/inferenceservices.pagoda.dev.yaml`.
"""

from __future__ import annotations

import sys

import yaml
from pydantic import BaseModel

from pagoda_operator.models import GROUP, KIND, PLURAL, VERSION, InferenceServiceSpec, InferenceServiceStatus
from pagoda_operator.names import NAME_RULES
from pagoda_operator.rules import cel_validations

_KEPT = (
    "description",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
)


def _without_nulls(value):
    """A default as the apiserver accepts it from any client: an unset optional field is left out,
    not null (kubectl apply drops nulls before sending; Helm and server-side apply do not)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _structural(schema: dict, defs: dict, *, in_list: bool = False) -> dict:
    """Pydantic's JSON schema → an OpenAPI v3 structural schema: refs inlined, optionals unwrapped.

    Inside a list item the apiserver fills no defaults (the operator's models still do): kubectl's
    client-side apply resends a whole list whose items the apiserver filled in, and would print
    `configured` for every re-apply of an unchanged file.
    """
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _structural(merged, defs, in_list=in_list)
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if types == {"string", "integer"}:
            out = {"x-kubernetes-int-or-string": True}
            out.update({k: rest[k] for k in _KEPT if k in rest})
            return out
        (only,) = branches
        return _structural({**only, **rest}, defs, in_list=in_list)
    out: dict = {"type": schema["type"]}
    out.update({k: schema[k] for k in _KEPT if k in schema})
    if schema["type"] == "object" and "properties" in schema:
        out["properties"] = {
            name: _structural(prop, defs, in_list=in_list) for name, prop in schema["properties"].items()
        }
        if schema.get("required"):
            out["required"] = schema["required"]
    elif schema["type"] == "object" and isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _structural(schema["additionalProperties"], defs, in_list=in_list)
    if schema["type"] == "object" and schema.get("additionalProperties", True) is True:
        # A Kubernetes object passed through (podTemplate): the apiserver checks it in the Deployment.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if schema["type"] == "array":
        out["items"] = _structural(schema["items"], defs, in_list=True)
    if "default" in schema and schema["default"] is not None and not in_list:
        default = schema["default"]
        # An object default of {} lets the apiserver fill the nested fields' own defaults, but the
        # apiserver checks an object's CEL rules against its default as written: those keep it whole.
        if isinstance(default, dict) and "properties" in out and "x-kubernetes-validations" not in out:
            default = {}
        out["default"] = _without_nulls(default)
    return out


def schema_of(model: type[BaseModel]) -> dict:
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}))


def build_crd() -> dict:
    spec = schema_of(InferenceServiceSpec)
    spec["description"] = "What to serve and how: the model, the runtime, its variants and their pods."
    status = schema_of(InferenceServiceStatus)
    status["description"] = "What the operator observed: conditions, replicas per variant and the URL."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "inferenceservice",
                "shortNames": ["infsvc"],
                # Not "all": `kubectl get all` would list InferenceServices beside KServe's of the same kind.
                "categories": ["pagoda"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                            "description": "Whether every variant has ready pods serving.",
                        },
                        {
                            "name": "Variants",
                            "type": "string",
                            "jsonPath": ".status.variantNames",
                            "description": "Variant names.",
                        },
                        {
                            "name": "Replicas",
                            "type": "string",
                            "jsonPath": ".status.replicaSummary",
                            "description": "Ready replicas over desired replicas, all variants together.",
                        },
                        {
                            "name": "Fits",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="ModelFits")].status',
                            "description": "Whether every variant's model fits its pods; False also while "
                            "a variant that no longer fits keeps serving on its old pods.",
                        },
                        {
                            "name": "Model",
                            "type": "string",
                            "jsonPath": ".spec.model.source",
                            "description": "Where the model comes from.",
                        },
                        {
                            "name": "URL",
                            "type": "string",
                            "jsonPath": ".status.url",
                            "description": "In-cluster base URL of the OpenAI-compatible API.",
                        },
                        {
                            "name": "Cache",
                            "type": "string",
                            "jsonPath": ".status.modelCache.summary",
                            "description": "The shared model download (Downloading n%, Ready, Failed), "
                            "or Sizing while a pvc:// model's checkpoint is read.",
                        },
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An LLM served by pagoda-runtime pods: one Deployment (a "
                            "LeaderWorkerSet across nodes) per quantization variant behind one Service, "
                            "autoscaled on queue depth.",
                            "required": ["spec"],
                            "x-kubernetes-validations": cel_validations(NAME_RULES),
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": "API version: pagoda.dev/v1alpha1.",
                                },
                                "kind": {"type": "string", "description": "InferenceService."},
                                # The apiserver owns metadata's schema and refuses anything added.
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_yaml() -> str:
    header = "# Generated by `python -m pagoda_operator.crd` from pagoda_operator/models.py; do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=110)


if __name__ == "__main__":
    sys.stdout.write(render_yaml())
