"""The operator's runtime fields are the runtime's settings: the same defaults and descriptions, and
a default InferenceService starts pods on the runtime's own defaults."""

from __future__ import annotations

import dataclasses

import pytest
from operator_specs import spec
from pagoda_operator.crd import build_crd
from pagoda_operator.models import DEFAULT_MAX_LORAS, ModelSpec, RuntimeSpec, VariantSpec
from pagoda_operator.render import runtime_args
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.names import TERMINATION_LOG
from pagoda_runtime.contract.serve_settings import DEFAULT_QUEUE_BATCHES, ServerSettings

NAME = "llama"


def _runtime_fields(model) -> dict[str, dataclasses.Field]:
    """The runtime settings whose flag a spec field of the same name sets."""
    return {
        field.name: field
        for settings in (EngineConfig, ServerSettings)
        for field in dataclasses.fields(settings)
        if "flag" in field.metadata and field.name in model.model_fields
    }


# Where the operator's default is its own, and why.
OPERATOR_DEFAULTS = {
    "log_format": "json",  # pods log JSON for collectors
    "enable_lora": None,  # on when spec.adapters lists any
    "max_loras": DEFAULT_MAX_LORAS,  # several tenants' adapters in one step
    "max_lora_rank": None,  # derived from the declared adapters' ranks
}


def test_the_spec_defaults_are_the_runtimes():
    covered = set()
    for model in (RuntimeSpec, VariantSpec, ModelSpec):
        for name, field in _runtime_fields(model).items():
            covered.add(name)
            expected = OPERATOR_DEFAULTS.get(name, field.default)
            assert model.model_fields[name].default == expected, f"{model.__name__}.{name}"
    assert {"max_num_seqs", "max_num_batched_tokens", "kv_cache_memory", "dtype", "max_queue"} <= covered


def test_the_spec_describes_a_setting_as_the_runtime_does():
    for name, field in _runtime_fields(RuntimeSpec).items():
        description = RuntimeSpec.model_fields[name].description
        assert description.lower().startswith(field.metadata["flag"].help[:20].lower()), name
    runtime = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    max_queue = runtime["properties"]["runtime"]["properties"]["maxQueue"]["description"]
    # What `kubectl explain` says about an unset maxQueue is what the runtime does (server/admission.py).
    assert f"unset: {DEFAULT_QUEUE_BATCHES} x maxNumSeqs" in max_queue and "--" not in max_queue


def test_a_default_inference_service_runs_the_runtimes_defaults():
    cli = pytest.importorskip("pagoda_runtime.cli")
    s = spec()
    args = cli.parser().parse_args(runtime_args(s, s.variants[0], NAME))
    assert cli.engine_config(args) == EngineConfig(model="/models/llama-3-8b", device="cuda")
    assert cli.server_settings(args) == ServerSettings(
        # The service's name, and the variant's own, which reaches this variant alone.
        served_model_names=(NAME, f"{NAME}:{s.variants[0].name}"),
        model="/models/llama-3-8b",
        drain_timeout=s.drain.timeout_seconds,
        termination_log=TERMINATION_LOG,
        log_format="json",
        metrics_compat="vllm",
    )


def test_an_embedding_service_starts_pooling_pods_and_refuses_speculation():
    """runtime.runner: pooling reaches the pods as --runner pooling; the default renders nothing, so
    the pod templates of every service written before the field stay as they were."""
    cli = pytest.importorskip("pagoda_runtime.cli")
    s = spec()
    default = runtime_args(s, s.variants[0], NAME)
    assert "--runner" not in default
    pooled = spec(runtime={"runner": "pooling"})
    args = runtime_args(pooled, pooled.variants[0], NAME)
    assert args[args.index("--runner") + 1] == "pooling"
    assert cli.engine_config(cli.parser().parse_args(args)).pooling
    with pytest.raises(ValueError, match="runtime.runner pooling embeds prompts"):
        spec(
            runtime={"runner": "pooling"},
            variants=[{"name": "fast", "speculative": {"method": "ngram", "numSpeculativeTokens": 3}}],
        )
