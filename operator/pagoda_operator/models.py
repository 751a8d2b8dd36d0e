"""The InferenceService spec and status as pydantic models: parsed once, at the edge.

The CRD's schema is generated from these models (`pagoda_operator.crd`), so every description
here is what `kubectl explain inferenceservice.spec...` shows, and the defaults here are the
defaults the apiserver fills in.
"""

from __future__ import annotations

import re
from dataclasses import MISSING
from dataclasses import fields as dataclass_fields
from typing import Any, ClassVar, Literal, get_type_hints

from pagoda_runtime.contract.config import DTYPES, KV_CACHE_DTYPES, QUANTIZATION_CHOICES, EngineConfig
from pagoda_runtime.contract.flags import default_of, flag_of
from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.names import REQUESTS_WAITING
from pagoda_runtime.contract.pooling import RUNNERS
from pagoda_runtime.contract.serve_settings import LOG_FORMATS, ServerSettings
from pagoda_runtime.contract.sizing import ModelArchitecture
from pagoda_runtime.contract.sources import COMMIT_PATTERN
from pagoda_runtime.contract.speculative import HEAD_METHODS, MAX_SPECULATIVE_TOKENS, METHODS, MTP
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator
from pydantic.alias_generators import to_camel

from pagoda_operator.parallelism import MAX_GPUS_PER_POD, MAX_NODES, RANKS_PER_POD_CEL
from pagoda_operator.rules import IS_GGUF_SOURCE, Rule, cel_validations, enforce

GROUP = "pagoda.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"

SOURCE_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?|file:///.+|hf://[^/\s]+/[^/\s]+(/\S+\.gguf)?"
    r"|bundled://[a-z0-9.-]+"
    r"|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?)$"
)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_OR_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

# The runtime's own flag values, so that a variant the apiserver admits is one the pods can start.
Quantization = Literal[QUANTIZATION_CHOICES]
KvCacheDtype = Literal[KV_CACHE_DTYPES]
Dtype = Literal[DTYPES]
# The proposers a variant can ask for, under vLLM's method names.
SpeculativeMethod = Literal[METHODS]
# "Is this method an EAGLE head's?", in CEL.
_IS_HEAD_METHOD = "self.method in [" + ", ".join(f"'{m}'" for m in HEAD_METHODS) + "]"
LogFormat = Literal[LOG_FORMATS]
Runner = Literal[RUNNERS]

# Adapter slots per GPU unless runtime.maxLoras says: a few tenants' adapters in one step, where the
# runtime's own default (vLLM's) of one would run one adapter's requests at a time.
DEFAULT_MAX_LORAS = 4
# The smallest --max-lora-rank the operator derives (vLLM's default): common ranks 8 and 16 fit it.
MIN_DERIVED_LORA_RANK = 16


def runtime_setting(settings: type, name: str, **field: Any) -> Any:
    """A field that sets the runtime flag of `settings`' field `name`: the runtime's own default and
    help (contract/config.py, contract/serve_settings.py), its flags named as the spec's fields."""
    described = re.sub(
        r"--([a-z][a-z0-9-]*)", lambda m: to_camel(m[1].replace("-", "_")), flag_of(settings, name).help
    )
    return Field(
        **{"default": default_of(settings, name), **field},
        description=described[0].upper() + described[1:] + ".",
    )


def _with_rules(schema: dict, cls: type[Spec]) -> None:
    if cls.RULES:
        schema["x-kubernetes-validations"] = cel_validations(cls.RULES)


class Spec(BaseModel):
    """A part of the spec; its RULES are checked here and by the apiserver (see rules.py)."""

    RULES: ClassVar[tuple[Rule, ...]] = ()
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_with_rules,
    )

    @model_validator(mode="after")
    def _rules_hold(self) -> Spec:
        enforce(self, type(self).RULES)
        return self


class SecretKeyRef(Spec):
    name: str = Field(description="Name of a Secret in the InferenceService's namespace.", min_length=1)
    key: str = Field(description="Key inside the Secret whose value is used.", min_length=1)


# The CRD names each architecture field in camelCase, except for the one InferenceServices wrote
# under another name before the architecture took Hugging Face's names.
_ARCHITECTURE_CRD_NAMES = {"num_hidden_layers": "numLayers"}


def _architecture_spec() -> type[Spec]:
    """The CRD's model.architecture, generated from the contract's ModelArchitecture so that a shape
    field is added in one place: its fields, defaults, descriptions and minimums."""
    types = get_type_hints(ModelArchitecture)
    fields = {
        f.name: (
            types[f.name],
            Field(
                ... if f.default is MISSING else f.default,
                alias=_ARCHITECTURE_CRD_NAMES.get(f.name),
                ge=f.metadata.get("minimum"),
                description=f.metadata["description"],
            ),
        )
        for f in dataclass_fields(ModelArchitecture)
    }
    return create_model("ArchitectureSpec", __base__=Spec, **fields)


ArchitectureSpec = _architecture_spec()


class ModelCacheSpec(Spec):
    size: str = Field(
        default="100Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$",
        description="Size of the PersistentVolumeClaim the model is downloaded into once.",
    )
    storage_class_name: str | None = Field(
        default=None, description="Storage class of the cache claim; the cluster's default when unset."
    )
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = Field(
        default="ReadWriteMany",
        description="ReadWriteMany lets replicas on every node mount the cache; where the storage class "
        "offers only ReadWriteOnce, the replicas are placed on the one node the volume is attached to.",
    )


class S3Spec(Spec):
    RULES = (
        Rule(
            "!has(self.credentialsSecretName) || !has(self.serviceAccountName)",
            lambda s: not (s.credentials_secret_name and s.service_account_name),
            "give either s3.credentialsSecretName or s3.serviceAccountName, not both",
        ),
    )

    endpoint: str = Field(
        default="https://s3.amazonaws.com",
        pattern=r"^https?://\S+$",
        description="URL of the S3-compatible endpoint (MinIO, Ceph, R2, GCS, AWS).",
    )
    region: str | None = Field(default=None, description="Region, where the endpoint needs one.")
    credentials_secret_name: str | None = Field(
        default=None,
        description="Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; anonymous when "
        "neither this nor serviceAccountName is set.",
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_OR_SUBDOMAIN,
        description="A ServiceAccount of the namespace whose token the download Job exchanges for "
        "credentials (STS AssumeRoleWithWebIdentity): IRSA on EKS (the ServiceAccount's "
        "eks.amazonaws.com/role-arn annotation), or any S3 store whose STS trusts the cluster's tokens. "
        "The token is mounted in the download Job only; the replicas never get one.",
    )
    role_arn: str | None = Field(
        default=None,
        description="The role to assume with the ServiceAccount's token (AWS_ROLE_ARN); on EKS the "
        "ServiceAccount's annotation sets it.",
    )
    token_audience: str = Field(
        default="sts.amazonaws.com", min_length=1, description="Audience of the ServiceAccount token."
    )
    sts_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="The STS endpoint to exchange the token at (AWS_ENDPOINT_URL_STS); AWS's by default. "
        "MinIO serves STS at its S3 endpoint.",
    )


def _remote_source_rules(owner: str, noun: str) -> tuple[Rule, ...]:
    """The rules of the fields an hf:// or s3:// source takes (source, revision, tokenSecretRef,
    hubEndpoint, s3), of a model and of an adapter alike; `owner` and `noun` name the object in the
    messages ("an adapter's " and "adapter")."""
    return (
        Rule(
            "self.source.startsWith('hf://') || (!has(self.tokenSecretRef) && !has(self.revision) "
            "&& !has(self.hubEndpoint))",
            lambda m: (
                m.source.startswith("hf://") or not (m.token_secret_ref or m.revision or m.hub_endpoint)
            ),
            f"{owner}tokenSecretRef, revision and hubEndpoint apply only to hf:// sources",
        ),
        Rule(
            "!self.source.startsWith('hf://') || has(self.revision)",
            lambda m: not m.source.startswith("hf://") or m.revision is not None,
            f"an hf:// {noun} needs revision: the 40-character commit id the cache is filled from",
        ),
        Rule(
            "self.source.startsWith('s3://') || !has(self.s3)",
            lambda m: m.source.startswith("s3://") or m.s3 is None,
            f"{owner}s3 applies only to s3:// sources",
        ),
    )


class ModelSourceSpec(Spec):
    """Where a model comes from and how it is sized: the served model's and a draft model's."""

    RULES = (
        *_remote_source_rules("", "source"),
        Rule(
            "self.source.startsWith('hf://') || "
            "((!has(self.allowPatterns) || self.allowPatterns.size() == 0) "
            "&& (!has(self.ignorePatterns) || self.ignorePatterns.size() == 0))",
            lambda m: m.source.startswith("hf://") or not (m.allow_patterns or m.ignore_patterns),
            "allowPatterns and ignorePatterns apply only to hf:// sources",
        ),
        Rule(
            "!self.source.matches('^hf://[^/]+/[^/]+/') || !has(self.allowPatterns) || "
            "self.allowPatterns.size() == 0",
            lambda m: not (re.match(r"^hf://[^/]+/[^/]+/", m.source) and m.allow_patterns),
            "an hf://org/name/file.gguf source names its one file already: drop allowPatterns",
        ),
        Rule(
            "self.source.startsWith('hf://') || self.source.startsWith('s3://') || !has(self.cache)",
            lambda m: m.source.startswith(("hf://", "s3://")) or m.cache is None,
            "cache applies only to hf:// and s3:// sources, which are downloaded into it",
        ),
        Rule(
            "!has(self.family) || !has(self.architecture)",
            lambda m: not (m.family and m.architecture),
            "give either family or architecture, not both",
        ),
    )

    source: str = Field(
        pattern=SOURCE_PATTERN,
        max_length=1024,
        description="Where the model comes from: hf://org/name, hf://org/name/file.gguf (that file "
        "alone) or s3://bucket/prefix (downloaded once into a shared cache claim), pvc://claim/path "
        "(mounted read-only), file:///path (baked into the image) or bundled://smollm2-135m (the small "
        "model shipped in the runtime image).",
    )
    family: str | None = Field(
        default=None,
        description="Known model family whose architecture sizes the pods: "
        + ", ".join(KNOWN_ARCHITECTURES)
        + ". Without family or architecture the operator cannot check that the model fits.",
        json_schema_extra={"enum": list(KNOWN_ARCHITECTURES)},
    )
    architecture: ArchitectureSpec | None = Field(
        default=None, description="The model's shape, for models that are not a known family."
    )
    revision: str | None = Field(
        default=None,
        pattern=COMMIT_PATTERN,
        description="Commit id of an hf:// model (required): the cache holds exactly this revision.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token, for gated or private hf:// models."
    )
    hub_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="A Hugging Face hub mirror to download hf:// models from (HF_ENDPOINT).",
    )
    allow_patterns: list[str] = Field(
        default=[],
        description="Of an hf:// repository, only the files matching one of these patterns (fnmatch, as "
        "huggingface_hub's allow_patterns), e.g. ['*Q4_K_M.gguf'] for one GGUF of many, or "
        "['*.json', '*.safetensors', 'tokenizer*']. Empty: every file.",
    )
    ignore_patterns: list[str] = Field(
        default=[],
        description="Of an hf:// repository, leave out the files matching these patterns (e.g. "
        "['original/*', '*.pth']).",
    )
    s3: S3Spec | None = Field(default=None, description="Endpoint and credentials of an s3:// source.")
    cache: ModelCacheSpec | None = Field(
        default=None,
        description="The claim an hf:// or s3:// model is downloaded into once and that every replica "
        "mounts read-only (100Gi, ReadWriteMany, the default storage class when unset).",
    )

    @field_validator("family")
    @classmethod
    def _known_family(cls, family: str | None) -> str | None:
        if family is not None and family not in KNOWN_ARCHITECTURES:
            raise ValueError(f"unknown family {family!r}; use one of {', '.join(KNOWN_ARCHITECTURES)}")
        return family

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]

    @property
    def is_gguf(self) -> bool:
        """A GGUF file; the bundled model is one."""
        return IS_GGUF_SOURCE.holds(self.source)

    def sizing_architecture(self) -> ModelArchitecture | None:
        if self.architecture is not None:
            return ModelArchitecture(**self.architecture.model_dump())
        return KNOWN_ARCHITECTURES.get(self.family) if self.family else None


class ModelSpec(ModelSourceSpec):
    served_name: str | None = Field(
        default=None,
        description="Model name clients send in requests; defaults to the InferenceService's name.",
    )
    max_model_len: int | None = runtime_setting(EngineConfig, "max_model_len", ge=16)


ADAPTER_SOURCE_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?|hf://[^/\s]+/[^/\s]+"
    r"|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?)$"
)
# An adapter is named by clients as their request's model, as a vLLM --lora-modules name.
ADAPTER_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.:/]*[A-Za-z0-9])?$"


class AdapterSpec(Spec):
    RULES = _remote_source_rules("an adapter's ", "adapter")

    name: str = Field(
        pattern=ADAPTER_NAME,
        max_length=128,
        description="The model name clients send to use this adapter; /v1/models lists it with the base "
        "model as its parent.",
    )
    source: str = Field(
        pattern=ADAPTER_SOURCE_PATTERN,
        max_length=1024,
        description="Where the PEFT adapter folder (adapter_config.json, adapter_model.safetensors) comes "
        "from: hf://org/name, s3://bucket/prefix or pvc://claim/path. Each is copied once into the "
        "namespace's adapter cache claim, checked, and loaded into the running pods without a restart.",
    )
    revision: str | None = Field(
        default=None,
        pattern=COMMIT_PATTERN,
        description="Commit id of an hf:// adapter (required): the cache holds exactly this revision.",
    )
    rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="The adapter's rank r, if known ahead: it sizes runtime.maxLoraRank when that is unset. "
        "Read from adapter_config.json once copied either way; an adapter above the pods' limit fails.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hugging Face token, for gated or private hf:// adapters."
    )
    hub_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="A Hugging Face hub mirror to download an hf:// adapter from (HF_ENDPOINT).",
    )
    s3: S3Spec | None = Field(default=None, description="Endpoint and credentials of an s3:// adapter.")

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]


class AdapterCacheSpec(Spec):
    size: str = Field(
        default="20Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$",
        description="Size of the namespace's adapter cache claim (pagoda-adapters), when this "
        "InferenceService is the first to create it.",
    )
    storage_class_name: str | None = Field(
        default=None,
        description="Storage class of the adapter cache claim, which must offer ReadWriteMany (every "
        "replica mounts it while new adapters are copied in); the cluster's default when unset.",
    )


class EnvVar(Spec):
    name: str = Field(min_length=1, description="Environment variable name.")
    value: str = Field(default="", description="Environment variable value.")


class RuntimeSpec(Spec):
    RULES = (
        Rule(
            "!has(self.maxCpuLoras) || self.maxCpuLoras >= self.maxLoras",
            lambda r: r.max_cpu_loras is None or r.max_cpu_loras >= r.max_loras,
            "runtime.maxCpuLoras must be at least runtime.maxLoras: host memory holds the adapters on "
            "the GPU too",
        ),
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        description="The pagoda-runtime container image. Unset, the operator's default (its "
        "--runtime-image flag, the Helm chart's runtime.image), which an operator upgrade moves, one "
        "InferenceService at a time; set it to pin this service to an image of its own.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="When the kubelet pulls the image."
    )
    image_pull_secrets: list[str] = Field(default=[], description="Secrets for pulling the image.")
    dtype: Dtype = runtime_setting(EngineConfig, "dtype")
    max_num_seqs: int = runtime_setting(EngineConfig, "max_num_seqs", ge=1)
    max_num_batched_tokens: int = runtime_setting(EngineConfig, "max_num_batched_tokens", ge=1)
    block_size: int = runtime_setting(EngineConfig, "block_size", ge=1)
    kv_cache_memory: float = runtime_setting(EngineConfig, "kv_cache_memory", gt=0)
    enable_prefix_caching: bool = runtime_setting(EngineConfig, "enable_prefix_caching")
    runner: Runner = runtime_setting(EngineConfig, "runner")
    enable_lora: bool | None = Field(
        default=None,
        description="Serve LoRA adapters (--enable-lora). Unset: on when spec.adapters lists any; set "
        "true to start the pods ready for adapters, so that adding the first one restarts nothing.",
    )
    max_loras: int = Field(
        default=DEFAULT_MAX_LORAS,
        ge=1,
        le=256,
        description="LoRA adapters resident on each GPU at once, hence in one step (--max-loras); each slot "
        "costs maxLoraRank's weights, which the fit check counts. More adapters than this take turns.",
    )
    max_lora_rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="Largest LoRA rank an adapter may have (--max-lora-rank). Unset: the largest "
        "adapters[].rank rounded up to a power of two, at least 16, so that adding an adapter of no "
        "larger rank restarts nothing (a larger one needs larger slots, which only new pods have).",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        ge=1,
        description="LoRA adapters kept in host memory, swapped onto the GPU on demand (--max-cpu-loras); "
        "unset: maxLoras. Those beyond are read from the adapter cache again when used.",
    )
    max_queue: int | None = runtime_setting(ServerSettings, "max_queue", ge=0)
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret whose value clients must send as a bearer token on /v1/*."
    )
    # Pods log JSON, one object per line, for the cluster's log collectors.
    log_format: LogFormat = runtime_setting(ServerSettings, "log_format", default="json")
    startup_timeout_seconds: int = Field(
        default=1800, ge=60, description="How long a pod may take to load its model before it is restarted."
    )
    extra_args: list[str] = Field(default=[], description="More pagoda-runtime serve flags, appended last.")
    env: list[EnvVar] = Field(default=[], description="More environment variables for the runtime container.")


# Inside a list item the apiserver fills no defaults (see crd.py), so the CEL rules supply them.
_MIN = "(has(self.min) ? self.min : 1)"
_MAX = "(has(self.max) ? self.max : 1)"


class ReplicaRange(Spec):
    RULES = (
        Rule(f"{_MIN} <= {_MAX}", lambda r: r.min <= r.max, "replicas.min must not exceed replicas.max"),
    )

    min: int = Field(
        default=1,
        ge=0,
        description="Fewest replicas; the autoscaler never goes below it. 0 with max above it: the "
        "variant scales to zero pods when idle (KEDA and spec.route needed, see autoscaling).",
    )
    max: int = Field(default=1, ge=0, description="Most replicas; equal to min disables autoscaling.")


class SpeculativeSpec(Spec):
    RULES = (
        Rule(
            "self.method != 'draft_model' || has(self.model)",
            lambda s: s.method != "draft_model" or s.model is not None,
            "speculative.method draft_model needs speculative.model: the draft model's source",
        ),
        Rule(
            f"!({_IS_HEAD_METHOD}) || has(self.model)",
            lambda s: s.method not in HEAD_METHODS or s.model is not None,
            "speculative.method eagle and eagle3 need speculative.model: the EAGLE head's source",
        ),
        Rule(
            "!(self.method in ['ngram', 'mtp']) || !has(self.model)",
            lambda s: s.method not in ("ngram", MTP) or s.model is None,
            "speculative.model applies only to methods draft_model, eagle and eagle3; the ngram method "
            "needs no model, and mtp drafts with the model's own multi-token-prediction layer",
        ),
        Rule(
            f"!({_IS_HEAD_METHOD}) || !has(self.model) || !has(self.model.family)",
            lambda s: s.method not in HEAD_METHODS or s.model is None or s.model.family is None,
            "speculative.model.family names a whole model, not an EAGLE head: leave it out (the head is "
            "sized from its config.json once read) or give speculative.model.architecture",
        ),
        Rule(
            f"!({_IS_HEAD_METHOD}) || !has(self.model) || !{IS_GGUF_SOURCE.cel('self.model.source')}",
            lambda s: s.method not in HEAD_METHODS or s.model is None or not s.model.is_gguf,
            "an EAGLE head's speculative.model.source is a folder (hf://, s3://, pvc:// or file://), not "
            "a GGUF file or the bundled model",
        ),
        Rule(
            "self.method == 'ngram' || (!has(self.promptLookupMax) && !has(self.promptLookupMin))",
            lambda s: s.method == "ngram" or (s.prompt_lookup_max is None and s.prompt_lookup_min is None),
            "speculative.promptLookupMax and promptLookupMin apply only to method ngram",
        ),
        Rule(
            "!has(self.promptLookupMax) || !has(self.promptLookupMin) || "
            "self.promptLookupMin <= self.promptLookupMax",
            lambda s: (
                None in (s.prompt_lookup_max, s.prompt_lookup_min)
                or s.prompt_lookup_min <= s.prompt_lookup_max
            ),
            "speculative.promptLookupMin must not exceed promptLookupMax",
        ),
        Rule(
            "!has(self.model) || !has(self.model.cache) || !has(self.model.cache.accessMode) || "
            "self.model.cache.accessMode != 'ReadWriteOnce'",
            lambda s: (
                s.model is None or s.model.cache is None or s.model.cache.access_mode != "ReadWriteOnce"
            ),
            "speculative.model.cache.accessMode must be ReadWriteMany: the replicas mount the draft's "
            "cache on whichever node they run on",
        ),
    )

    method: SpeculativeMethod = Field(
        description="The proposer that drafts tokens for the target model to verify: ngram (prompt "
        "lookup: tokens that followed the same n-gram earlier in the sequence, no extra model), "
        "draft_model (a small model with the target's tokenizer, its own KV cache beside the target's), "
        "eagle3 or eagle (an EAGLE-3 or EAGLE-1 head: one decoder layer drafting from the model's own "
        "hidden states, held whole by the first GPU), mtp (the multi-token-prediction layer DeepSeek V3 "
        "and GLM-4.5 checkpoints hold, split over the GPUs like the model's layers).",
    )
    num_speculative_tokens: int = Field(
        ge=1,
        le=MAX_SPECULATIVE_TOKENS,
        description="Tokens drafted per step, all verified in one step of the target model.",
    )
    prompt_lookup_max: int | None = Field(
        default=None,
        ge=1,
        description="ngram: the longest n-gram looked up in the sequence's earlier tokens; unset, "
        "promptLookupMin, or the runtime's default when both are unset.",
    )
    prompt_lookup_min: int | None = Field(
        default=None, ge=1, description="ngram: the shortest n-gram looked up; unset, promptLookupMax."
    )
    model: ModelSourceSpec | None = Field(
        default=None,
        description="draft_model: the draft's source, as model's (downloaded into a cache claim of its "
        "own, mounted read-only, or bundled), and its family or architecture, which size its weights "
        "and KV cache in the fit check. eagle3, eagle: the head's folder (hf://, s3://, pvc:// or "
        "file://), sized from its config.json once downloaded or read (or from architecture, with one "
        "layer).",
    )

    @property
    def eagle_head(self) -> bool:
        return self.method in HEAD_METHODS

    @property
    def draft(self) -> ModelSpec | None:
        """The draft model (or EAGLE head) as a model of its own, for the cache code every model goes
        through."""
        return None if self.model is None else ModelSpec(**dict(self.model))


class VariantSpec(Spec):
    name: str = Field(
        pattern=DNS_LABEL, max_length=20, description="Variant name, used in child object names and labels."
    )
    quantization: Quantization = Field(
        default=default_of(EngineConfig, "quantization"),
        description="Weight quantization of this variant: see docs/architecture.md#quantization.",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=default_of(EngineConfig, "kv_cache_dtype"),
        description="Element type of the KV cache: auto (the model's dtype) or fp8 (e4m3: half the "
        "bytes of bf16, so twice the cached tokens).",
    )
    replicas: ReplicaRange = Field(default=ReplicaRange(), description="Replica range of this variant.")
    speculative: SpeculativeSpec | None = Field(
        default=None,
        description="Speculative decoding: a proposer drafts tokens that the model verifies in one step, "
        "keeping its output distribution exactly (the runtime's --speculative-config).",
    )
    traffic: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Percent of the requests on spec.route's shared path this variant gets (a canary: 5). "
        "Set on every variant, summing to 100, or on none: then requests spread over all pods. A change "
        "rewrites the route only; no pod restarts.",
    )


class ResourcesSpec(Spec):
    gpus: int = Field(
        default=1,
        ge=0,
        le=MAX_GPUS_PER_POD,
        description=f"GPUs per pod, up to a node's {MAX_GPUS_PER_POD}, or 0 to run on the CPU. The "
        "runtime runs one tensor-parallel rank per GPU (see parallelism); scale out with replicas.",
    )
    gpu_product: str | None = Field(
        default=None,
        description="Value of the nvidia.com/gpu.product node label (set by NVIDIA's GPU feature "
        "discovery) the pods prefer; required only with gpuProductRequired.",
    )
    gpu_product_required: bool = Field(
        default=False,
        description="Schedule only on nodes labelled nvidia.com/gpu.product=gpuProduct. Leave false where "
        "GPU feature discovery does not label the nodes, or the pods never schedule.",
    )
    gpu_memory: str | int | None = Field(
        default=None,
        description="Memory of one GPU (a quantity such as 80Gi), used to check that variants fit.",
    )
    cpu: str | int | None = Field(default=None, description="CPU request of each pod.")
    memory: str | int | None = Field(
        default=None,
        description="Memory request and limit of each pod; the capacity CPU variants are sized against.",
    )


class ParallelismSpec(Spec):
    tensor: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_POD * MAX_NODES,
        description="Tensor-parallel size: how many ranks split the model's attention heads, MLP and "
        "vocabulary, one per GPU. Unset, it is resources.gpus x nodes (1 on the CPU); given, it must "
        "equal that product (there is no pipeline parallelism). It must divide the model's heads.",
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="Pods one replica of the model spans, each with resources.gpus GPUs: 1 gives a "
        "Deployment, more a LeaderWorkerSet per variant (LeaderWorkerSet must be installed) whose "
        "leader serves HTTP while its workers compute.",
    )


class AutoscalingSpec(Spec):
    enabled: bool = Field(default=True, description="Autoscale the variants with max > min.")
    actuator: Literal["hpa", "keda"] | None = Field(
        default=None,
        description="What scales the variants: keda (a KEDA ScaledObject per variant, querying "
        "Prometheus directly; needed to scale to zero) or hpa (a HorizontalPodAutoscaler reading "
        "the queue depth through a custom metrics adapter). Unset: keda when KEDA's CRDs are "
        "installed, else hpa.",
    )
    scale_to_zero_after_seconds: int = Field(
        default=600,
        ge=0,
        description="How long a variant with replicas.min 0 stays idle (no request at the gateway for "
        "it, an empty queue) before its last pod goes; it is never removed sooner than "
        "runtime.startupTimeoutSeconds after the autoscaler was created, so a first load is not cut "
        "short.",
    )
    polling_interval_seconds: int = Field(
        default=15,
        ge=1,
        le=300,
        description="How often KEDA queries Prometheus; a variant at zero wakes within about this "
        "plus the scrape interval of the first request.",
    )
    target_queue_depth: int = Field(
        default=4,
        ge=1,
        description=f"Waiting requests per pod ({REQUESTS_WAITING}) the autoscaler aims for.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0, ge=0, le=3600, description="Window of recommendations considered before scaling up."
    )
    scale_down_stabilization_seconds: int = Field(
        default=300, ge=0, le=3600, description="Window of recommendations considered before scaling down."
    )


class GatewayRef(Spec):
    name: str = Field(min_length=1, description="Name of the Gateway (gateway.networking.k8s.io).")
    namespace: str | None = Field(
        default=None, description="Namespace of the Gateway; the InferenceService's own when unset."
    )
    section_name: str | None = Field(
        default=None,
        description="The Gateway listener to attach to; every listener that allows it when unset.",
    )


class RouteSpec(Spec):
    gateway_ref: GatewayRef = Field(description="The Gateway the HTTPRoute attaches to.")
    hostnames: list[str] = Field(
        default=[], description="Host names the route answers; every host the listener accepts when empty."
    )
    path: str | None = Field(
        default=None,
        pattern=r"^/[-a-zA-Z0-9._~/]*$",
        description="Path prefix of the shared route, which splits requests over the variants "
        "(variants[].traffic) and is rewritten to / (clients use <gateway><path>/v1 as base URL); "
        "/<name> when unset. Each variant is also reached at /<name>/<variant>/v1, and by its model "
        "name <servedName>:<variant>.",
    )


class DrainSpec(Spec):
    timeout_seconds: int = Field(
        default=120, ge=0, description="How long a stopping pod keeps finishing accepted requests."
    )
    endpoint_removal_seconds: int = Field(
        default=10,
        ge=0,
        description="How long a stopping pod keeps serving before it drains, so Services and load balancers "
        "stop sending it traffic first (the preStop sleep).",
    )


class Toleration(Spec):
    key: str | None = Field(
        default=None, description="Taint key the toleration matches; empty matches all keys."
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value to match with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


class SchedulingSpec(Spec):
    node_selector: dict[str, str] = Field(default={}, description="Node labels the pods must run on.")
    tolerations: list[Toleration] = Field(default=[], description="Taints the pods tolerate.")
    priority_class_name: str | None = Field(default=None, description="PriorityClass of the pods.")


class MonitoringSpec(Spec):
    service_monitor: bool = Field(
        default=True,
        description="Create a Prometheus Operator ServiceMonitor (when the monitoring.coreos.com CRD "
        "exists).",
    )
    interval: str = Field(default="15s", pattern=r"^[0-9]+(ms|s|m)$", description="Scrape interval.")


def _is_zero(value: int | str | None) -> bool:
    return str(value) in ("0", "0%")


class RolloutSpec(Spec):
    RULES = (
        Rule(
            "!(has(self.maxSurge) && has(self.maxUnavailable) && string(self.maxSurge) in ['0', '0%'] "
            "&& string(self.maxUnavailable) in ['0', '0%'])",
            lambda r: not (_is_zero(r.max_surge) and _is_zero(r.max_unavailable)),
            "rollout.maxSurge and rollout.maxUnavailable must not both be 0: the rollout could never start",
        ),
    )

    max_surge: int | str | None = Field(
        default=None,
        description="Pods a rollout may start above the desired count (a number or a percentage). "
        "Unset: 0 for GPU pods, so that a rollout never waits for a GPU that a full node pool does not "
        "have (a pod stops before its replacement starts), and 1 for CPU pods.",
    )
    max_unavailable: int | str | None = Field(
        default=None,
        description="Pods a rollout may stop before their replacements are ready (a number or a "
        "percentage). Unset: 1 for GPU pods (a one-replica variant is down while its new pod loads) "
        "and 0 for CPU pods.",
    )
    replacement_timeout_seconds: int = Field(
        default=900,
        ge=0,
        description="How long a renamed or removed variant keeps serving while the variants that "
        "replace it have no ready pod; after that it is removed anyway, and an event says so.",
    )

    def strategy(self, gpus: int) -> dict:
        """The Deployment's rollingUpdate (a LeaderWorkerSet's, counted in groups): the fields given, the
        device's defaults for the others."""
        surge, unavailable = (0, 1) if gpus else (1, 0)
        surge = surge if self.max_surge is None else self.max_surge
        unavailable = unavailable if self.max_unavailable is None else self.max_unavailable
        if _is_zero(surge) and _is_zero(unavailable):
            # Only one of them was given, as 0: the other one lets the rollout move.
            surge, unavailable = (1, unavailable) if self.max_surge is None else (surge, 1)
        return {"maxSurge": surge, "maxUnavailable": unavailable}


class NetworkPolicySpec(Spec):
    enabled: bool = Field(
        default=False,
        description="Create a NetworkPolicy that admits traffic to the pods only from the clients below "
        "and from Prometheus.",
    )
    client_pod_labels: dict[str, str] = Field(
        default={},
        description="Labels of the pods in the InferenceService's namespace that may call the API; "
        "every pod of the namespace when empty.",
    )
    client_namespace_labels: dict[str, str] | None = Field(
        default=None, description="Labels of other namespaces whose pods may call the API too."
    )
    prometheus_namespace_labels: dict[str, str] = Field(
        default={"kubernetes.io/metadata.name": "monitoring"},
        description="Labels of the namespace Prometheus runs in; its pods may scrape /metrics.",
    )


class _Open(Spec):
    """A Kubernetes object passed through as written; the apiserver validates it in the Deployment."""

    model_config = ConfigDict(extra="allow")


class NamedVolume(_Open):
    name: str = Field(
        min_length=1,
        description="Volume name; dshm, tmp, cache, model, draft and adapters are the runtime's.",
    )


class NamedVolumeMount(_Open):
    name: str = Field(min_length=1, description="Name of the volume to mount.")
    mount_path: str = Field(min_length=1, description="Where in the runtime container.")


class NamedEnvVar(_Open):
    name: str = Field(min_length=1, description="Environment variable name (value or valueFrom as in a pod).")


_RUNTIME_VOLUMES = ("dshm", "tmp", "cache", "model", "draft", "adapters")


class PodTemplateOverrides(Spec):
    RULES = (
        Rule(
            f"!has(self.volumes) || self.volumes.all(v, !(v.name in {list(_RUNTIME_VOLUMES)}))",
            lambda t: all(v.name not in _RUNTIME_VOLUMES for v in t.volumes),
            "podTemplate.spec.volumes must not reuse the runtime's volume names "
            + ", ".join(_RUNTIME_VOLUMES),
        ),
    )

    affinity: dict[str, Any] | None = Field(default=None, description="The pods' affinity, as in a pod spec.")
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default=[], description="How the pods spread over zones or nodes, as in a pod spec."
    )
    runtime_class_name: str | None = Field(default=None, description="RuntimeClass of the pods.")
    env: list[NamedEnvVar] = Field(
        default=[], description="More environment variables of the runtime container."
    )
    volumes: list[NamedVolume] = Field(default=[], description="More volumes of the pods.")
    volume_mounts: list[NamedVolumeMount] = Field(
        default=[], description="More volume mounts of the runtime container."
    )


class PodTemplateMetadata(Spec):
    labels: dict[str, str] = Field(default={}, description="More labels of the pods.")
    annotations: dict[str, str] = Field(default={}, description="More annotations of the pods.")


class PodTemplate(Spec):
    metadata: PodTemplateMetadata = Field(
        default=PodTemplateMetadata(), description="Pod labels and annotations."
    )
    spec: PodTemplateOverrides = Field(
        default=PodTemplateOverrides(), description="Pod fields merged over the rendered pod."
    )


# About a variant `v` whose replicas are given (list items get no defaults): not min 0 below max.
_V_MIN, _V_MAX = (bound.replace("self.", "v.replicas.") for bound in (_MIN, _MAX))
_NOT_TO_ZERO_CEL = f"!({_V_MIN} == 0 && {_V_MAX} > 0)"


def _scales_to_zero(variant: VariantSpec) -> bool:
    return variant.replicas.min == 0 < variant.replicas.max


def _gguf_needs_gguf(spec: InferenceServiceSpec) -> bool:
    return spec.model.is_gguf or all(v.quantization != "gguf" for v in spec.variants)


def _gguf_is_not_awq(spec: InferenceServiceSpec) -> bool:
    return not spec.model.is_gguf or all(v.quantization not in ("awq", "gptq") for v in spec.variants)


class InferenceServiceSpec(Spec):
    RULES = (
        Rule(
            "self.runtime.runner != 'pooling' || self.variants.all(v, !has(v.speculative))",
            lambda s: s.runtime.runner != "pooling" or all(v.speculative is None for v in s.variants),
            "runtime.runner pooling embeds prompts and generates no tokens to speculate on: drop the "
            "variants' speculative or the runner",
        ),
        Rule(
            f"!has(self.parallelism.tensor) || self.parallelism.tensor == {RANKS_PER_POD_CEL} * "
            "self.parallelism.nodes",
            lambda s: s.parallelism.tensor in (None, s.tensor_parallel_size),
            "parallelism.tensor must equal resources.gpus x parallelism.nodes (one rank per GPU; "
            "there is no pipeline parallelism): leave it unset to have it derived",
        ),
        Rule(
            "self.parallelism.nodes == 1 || self.resources.gpus >= 1",
            lambda s: s.parallelism.nodes == 1 or s.resources.gpus >= 1,
            "parallelism.nodes above 1 needs GPU pods (resources.gpus at least 1): a CPU replica runs "
            "in one pod",
        ),
        Rule(
            "self.parallelism.nodes == 1 || !has(self.model.cache) || !has(self.model.cache.accessMode) "
            "|| self.model.cache.accessMode != 'ReadWriteOnce'",
            lambda s: (
                s.parallelism.nodes == 1
                or s.model.cache is None
                or s.model.cache.access_mode != "ReadWriteOnce"
            ),
            "parallelism.nodes above 1 needs model.cache.accessMode ReadWriteMany: a ReadWriteOnce cache "
            "holds every pod on the one node its volume is attached to",
        ),
        Rule(
            "self.variants.all(v, !has(v.traffic)) || (self.variants.all(v, has(v.traffic)) && "
            "self.variants.map(v, v.traffic).sum() == 100)",
            lambda s: (
                all(v.traffic is None for v in s.variants)
                or (
                    all(v.traffic is not None for v in s.variants)
                    and sum(v.traffic for v in s.variants) == 100
                )
            ),
            "variants[].traffic must be set on every variant and sum to 100, or on none",
        ),
        Rule(
            "has(self.route) || self.variants.all(v, !has(v.traffic))",
            lambda s: s.route is not None or all(v.traffic is None for v in s.variants),
            "variants[].traffic needs spec.route: the gateway's HTTPRoute makes the split",
        ),
        Rule(
            "!has(self.route) || self.variants.all(v, v.name != 'v1')",
            lambda s: s.route is None or all(v.name != "v1" for v in s.variants),
            "a routed variant must not be named v1: /<name>/v1 is the shared route's API path",
        ),
        Rule(
            f"self.variants.all(v, !has(v.replicas) || {_NOT_TO_ZERO_CEL} || has(self.route))",
            lambda s: s.route is not None or not any(_scales_to_zero(v) for v in s.variants),
            "replicas.min 0 below a larger max needs spec.route: a variant with no pods is woken by the "
            "requests its gateway sees",
        ),
        Rule(
            "!has(self.autoscaling) || !has(self.autoscaling.actuator) || self.autoscaling.actuator != 'hpa' "
            f"|| self.variants.all(v, !has(v.replicas) || {_NOT_TO_ZERO_CEL})",
            lambda s: s.autoscaling.actuator != "hpa" or not any(_scales_to_zero(v) for v in s.variants),
            "replicas.min 0 below a larger max needs autoscaling.actuator keda: a HorizontalPodAutoscaler "
            "cannot scale to zero",
        ),
        Rule(
            "self.variants.all(v, self.variants.exists_one(w, w.name == v.name))",
            lambda s: len({v.name for v in s.variants}) == len(s.variants),
            "variant names must be unique",
        ),
        Rule(
            "!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
            lambda s: len({a.name for a in s.adapters}) == len(s.adapters),
            "adapter names must be unique: clients choose an adapter by its name",
        ),
        Rule(
            "!has(self.adapters) || !has(self.model.servedName) || "
            "self.adapters.all(a, a.name != self.model.servedName)",
            lambda s: s.model.served_name is None or all(a.name != s.model.served_name for a in s.adapters),
            "an adapter must not take the base model's name (model.servedName): clients choose by name",
        ),
        Rule(
            "!has(self.adapters) || self.adapters.size() == 0 || !has(self.runtime.enableLora) || "
            "self.runtime.enableLora",
            lambda s: not s.adapters or s.runtime.enable_lora is not False,
            "adapters need runtime.enableLora: set it true or leave it unset",
        ),
        Rule(
            "!has(self.adapters) || self.adapters.size() == 0 || "
            "!self.runtime.extraArgs.exists(a, a.startsWith('--lora-modules'))",
            lambda s: not s.adapters or not any(a.startswith("--lora-modules") for a in s.runtime.extra_args),
            "declare every adapter in spec.adapters, not --lora-modules in runtime.extraArgs: the pods serve "
            "exactly spec.adapters",
        ),
        Rule(
            "!has(self.adapters) || !has(self.runtime.maxLoraRank) || "
            "self.adapters.all(a, !has(a.rank) || a.rank <= self.runtime.maxLoraRank)",
            lambda s: (
                s.runtime.max_lora_rank is None
                or all(a.rank is None or a.rank <= s.runtime.max_lora_rank for a in s.adapters)
            ),
            "an adapter's rank is above runtime.maxLoraRank: raise maxLoraRank (new pods start with the "
            "larger slots) or leave it unset to have it derived from the adapters' ranks",
        ),
        Rule(
            "self.variants.all(v, !has(v.quantization) || v.quantization != 'gguf' || "
            f"{IS_GGUF_SOURCE.cel('self.model.source')})",
            _gguf_needs_gguf,
            "quantization gguf needs a GGUF model source (a .gguf file or bundled://); use auto or none",
        ),
        Rule(
            "self.variants.all(v, !has(v.quantization) || !(v.quantization in ['awq', 'gptq']) || "
            f"!{IS_GGUF_SOURCE.cel('self.model.source')})",
            _gguf_is_not_awq,
            "a GGUF model source holds GGUF blocks, not AWQ or GPTQ weights; use gguf, auto or none",
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    runtime: RuntimeSpec = Field(
        default=RuntimeSpec(), description="The pagoda-runtime container and its engine."
    )
    variants: list[VariantSpec] = Field(
        min_length=1,
        max_length=8,
        description="Quantization variants served side by side behind one Service, each its own "
        "Deployment (or LeaderWorkerSet, when a replica spans nodes). "
        "A map keyed by name: server-side apply merges variants by name, so that several field managers "
        "can each own their own.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    adapters: list[AdapterSpec] = Field(
        default=[],
        max_length=64,
        description="LoRA adapters of the model that every variant serves, each chosen by clients as "
        "its name. Adding or removing one loads or unloads it in the running pods through the "
        "runtime's API: no pod restarts (status.variants[].adapters shows each one's state).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    adapter_cache: AdapterCacheSpec = Field(
        default=AdapterCacheSpec(),
        description="The namespace's claim the adapters are copied into and every replica of a service "
        "with LoRA mounts read-only.",
    )
    resources: ResourcesSpec = Field(default=ResourcesSpec(), description="Resources of each pod.")
    parallelism: ParallelismSpec = Field(
        default=ParallelismSpec(),
        description="How one replica of the model is split: tensor-parallel ranks over the GPUs of one "
        "pod, or of a group of pods on several nodes.",
    )
    autoscaling: AutoscalingSpec = Field(default=AutoscalingSpec(), description="Autoscaling on queue depth.")
    route: RouteSpec | None = Field(
        default=None,
        description="Serve through a Gateway API Gateway: an HTTPRoute splits requests over the variants "
        "by variants[].traffic and reaches each variant by its own path and model name.",
    )
    drain: DrainSpec = Field(default=DrainSpec(), description="Graceful shutdown of pods.")
    scheduling: SchedulingSpec = Field(default=SchedulingSpec(), description="Where the pods may run.")
    monitoring: MonitoringSpec = Field(default=MonitoringSpec(), description="Prometheus scraping.")
    rollout: RolloutSpec = Field(default=RolloutSpec(), description="How a spec edit replaces pods.")
    network_policy: NetworkPolicySpec = Field(
        default=NetworkPolicySpec(), description="Which pods may reach the runtime pods."
    )
    pod_template: PodTemplate = Field(
        default=PodTemplate(),
        description="An escape hatch merged over the rendered pods: affinity, topology spread, "
        "runtimeClassName, extra env, volumes and mounts, labels and annotations. The operator's own "
        "selector labels win; the apiserver validates the result.",
    )

    @property
    def ranks_per_pod(self) -> int:
        return self.resources.gpus or 1

    @property
    def tensor_parallel_size(self) -> int:
        return self.ranks_per_pod * self.parallelism.nodes

    @property
    def spans_nodes(self) -> bool:
        """A replica is a LeaderWorkerSet group of several pods rather than one Deployment pod."""
        return self.parallelism.nodes > 1

    @property
    def lora_enabled(self) -> bool:
        """The pods start with --enable-lora: asked for, or adapters declared."""
        return bool(self.adapters) if self.runtime.enable_lora is None else self.runtime.enable_lora

    @property
    def max_lora_rank(self) -> int:
        """The pods' --max-lora-rank: as given, else the largest declared rank rounded up to a power of
        two and at least MIN_DERIVED_LORA_RANK (so most additions leave the pods as they are)."""
        if self.runtime.max_lora_rank is not None:
            return self.runtime.max_lora_rank
        largest = max((a.rank for a in self.adapters if a.rank is not None), default=1)
        return max(MIN_DERIVED_LORA_RANK, 1 << (largest - 1).bit_length())


class Condition(Spec):
    type: str = Field(
        description="Ready, Progressing, Degraded, ModelFits, Reconciling and Stalled (kstatus's, for "
        "Flux and kpt), and with spec.route RouteAccepted and RouteResolvedRefs (the HTTPRoute's own "
        "conditions at its Gateway)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word saying why.")
    message: str = Field(default="", description="What happened, for humans.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, description="The generation this condition is about."
    )


class AdapterStatus(Spec):
    name: str = Field(description="Adapter name.")
    state: Literal["Downloading", "Loading", "Loaded", "Failed"] = Field(
        description="Downloading into the adapter cache, Loading into the ready pods, Loaded in every "
        "ready pod, or Failed (message says why)."
    )
    message: str = Field(default="", description="Pods loaded, download progress, or why it failed.")


class VariantStatus(Spec):
    name: str = Field(description="Variant name.")
    replicas: int = Field(default=0, description="Pods of this variant.")
    ready_replicas: int = Field(default=0, description="Pods of this variant that are ready to serve.")
    fits: bool | None = Field(default=None, description="Whether the model fits this variant's pods.")
    adapters: list[AdapterStatus] = Field(
        default=[], description="Each of spec.adapters in this variant's ready pods."
    )
    service: str | None = Field(default=None, description="The Service of this variant's pods alone.")
    path: str | None = Field(
        default=None, description="Path prefix of this variant on the gateway (spec.route), before /v1."
    )
    model_names: list[str] = Field(default=[], description="Model names this variant's pods answer to.")


class RetiringStatus(Spec):
    since: str = Field(description="When the operator began waiting for the replacing variants.")
    deployments: list[str] = Field(
        default=[], description="Deployments (or LeaderWorkerSets) kept serving meanwhile."
    )


class ModelCacheStatus(Spec):
    claim_name: str = Field(description="The PersistentVolumeClaim holding the model.")
    phase: Literal["Pending", "Downloading", "Sizing", "Ready", "Failed"] = Field(
        description="Where the download is (Sizing: a pvc:// model's checkpoint is being read)."
    )
    progress: int | None = Field(default=None, description="Percent downloaded, while downloading.")
    message: str = Field(default="", description="Bytes so far and rate, or why it failed.")
    summary: str = Field(default="", description="Phase and percent, as printed (Downloading 42%).")


class InferenceServiceStatus(Spec):
    conditions: list[Condition] = Field(
        default=[],
        description="Ready, Progressing, Degraded, ModelFits, Reconciling and Stalled; RouteAccepted, "
        "RouteResolvedRefs.",
    )
    variants: list[VariantStatus] = Field(default=[], description="Replicas per variant.")
    url: str | None = Field(default=None, description="In-cluster base URL of the OpenAI-compatible API.")
    observed_generation: int | None = Field(default=None, description="The spec generation last reconciled.")
    variant_names: str | None = Field(default=None, description="Variant names, comma-separated (printed).")
    replica_summary: str | None = Field(
        default=None, description="Ready replicas over desired replicas (printed)."
    )
    model_cache: ModelCacheStatus | None = Field(
        default=None, description="The shared download of an hf:// or s3:// model."
    )
    retiring: RetiringStatus | None = Field(
        default=None,
        description="Children of renamed or removed variants kept serving until the variants that "
        "replace them have ready pods.",
    )
