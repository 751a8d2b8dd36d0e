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
)


def _structural(schema: dict, defs: dict) -> dict:
    """Pydantic's JSON schema → an OpenAPI v3 structural schema: refs inlined, optionals unwrapped."""
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[1]]
        return _structural({**target, **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        if types == {"string", "integer"}:
            out = {"x-kubernetes-int-or-string": True}
            out.update({k: rest[k] for k in _KEPT if k in rest})
            return out
        (only,) = branches
        return _structural({**only, **rest}, defs)
    out: dict = {"type": schema["type"]}
    out.update({k: schema[k] for k in _KEPT if k in schema})
    if schema["type"] == "object" and "properties" in schema:
        out["properties"] = {name: _structural(prop, defs) for name, prop in schema["properties"].items()}
        if schema.get("required"):
            out["required"] = schema["required"]
    elif schema["type"] == "object":
        out["additionalProperties"] = _structural(schema["additionalProperties"], defs)
    if schema["type"] == "array":
        out["items"] = _structural(schema["items"], defs)
    if "default" in schema and schema["default"] is not None:
        default = schema["default"]
        # An object default of {} lets the apiserver fill the nested fields' own defaults, but the
        # apiserver checks an object's CEL rules against its default as written: those keep it whole.
        if isinstance(default, dict) and "x-kubernetes-validations" not in out:
            default = {}
        out["default"] = default
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
                "categories": ["all", "pagoda"],
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
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An LLM served by pagoda-runtime pods: one Deployment per "
                            "quantization variant behind one Service, autoscaled on queue depth.",
                            "required": ["spec"],
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
