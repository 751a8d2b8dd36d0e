"""Names both sides of the pod boundary use: what the runtime exports and listens on, and what the
operator's probes, autoscaler and monitoring ask it for. The runtime serves and exports under these
names, the operator renders them, and a test checks that manifests/ (adapter rules, dashboard)
name only these metrics.
"""

from __future__ import annotations

# The HTTP port the server listens on by default, and the one the operator's pods expose.
HTTP_PORT = 8000
# Where rank 0 (the leader pod's first rank) listens for the others to join the process group.
DISTRIBUTED_PORT = 29500
# What LeaderWorkerSet injects into every pod of a group (all three or none): where the ranks of a
# replica that spans pods find each other (parallel/world_layout.py reads them).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
LWS_VARIABLES = (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX)
# The environment variable the server reads its API key from when --api-key is not given; the
# operator sets it from InferenceService.spec.runtime.apiKeySecretRef.
API_KEY_ENV = "PAGODA_API_KEY"
# Kubernetes' default terminationMessagePath; the runtime writes a fatal start-up error there.
TERMINATION_LOG = "/dev/termination-log"

# Probe paths: liveness (the engine loop turns), readiness (a canary generation passed), scraping.
LIVE_PATH = "/health/live"
READY_PATH = "/health/ready"
METRICS_PATH = "/metrics"

# Prometheus families as the server registers them (counters are scraped with a _total suffix,
# histograms with _bucket, _sum and _count).
REQUESTS_WAITING = "pagoda_num_requests_waiting"  # the queue depth each variant's HPA targets
# The same queue split by the requests' priority, for an HPA that scales on interactive demand only.
REQUESTS_WAITING_BY_PRIORITY = "pagoda_num_requests_waiting_by_priority"
REQUESTS_RUNNING = "pagoda_num_requests_running"
KV_CACHE_USAGE = "pagoda_kv_cache_usage_ratio"
PREFIX_CACHE_QUERIES = "pagoda_prefix_cache_queries"
PREFIX_CACHE_HITS = "pagoda_prefix_cache_hits"
PREEMPTIONS = "pagoda_num_preemptions"
FAILED_STEPS = "pagoda_num_failed_steps"
PROMPT_TOKENS = "pagoda_prompt_tokens"
GENERATION_TOKENS = "pagoda_generation_tokens"
REQUESTS_FINISHED = "pagoda_requests"
REQUESTS_REJECTED = "pagoda_requests_rejected"
TIME_TO_FIRST_TOKEN = "pagoda_time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "pagoda_inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "pagoda_e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "pagoda_request_queue_time_seconds"
# Speculative decoding's counters, exported only while it is on, under vLLM's own names (no
# Pagoda-named copy: the names dashboards for speculative decoding already query).
SPEC_DECODE_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
# With --enable-lora: vLLM's lora_requests_info (its labels below, the value the scrape's time),
# which gateways with LoRA affinity read, and finished requests per adapter.
LORA_REQUESTS_INFO = "pagoda_lora_requests_info"
LORA_REQUESTS = "pagoda_lora_requests"
# Per finished request, as vLLM's production-stack dashboards read them: mean decode time per
# output token, prefill (first scheduled to first token) and decode (first to last token) time, and
# the prompt, generated and max_tokens lengths.
REQUEST_TIME_PER_OUTPUT_TOKEN = "pagoda_request_time_per_output_token_seconds"
REQUEST_PREFILL_TIME = "pagoda_request_prefill_time_seconds"
REQUEST_DECODE_TIME = "pagoda_request_decode_time_seconds"
REQUEST_PROMPT_TOKENS = "pagoda_request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "pagoda_request_generation_tokens"
REQUEST_MAX_GENERATION_TOKENS = "pagoda_request_max_num_generation_tokens"
METRICS = (
    REQUESTS_WAITING,
    REQUESTS_WAITING_BY_PRIORITY,
    REQUESTS_RUNNING,
    KV_CACHE_USAGE,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PREEMPTIONS,
    FAILED_STEPS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    REQUESTS_FINISHED,
    REQUESTS_REJECTED,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME,
    LORA_REQUESTS_INFO,
    LORA_REQUESTS,
    REQUEST_TIME_PER_OUTPUT_TOKEN,
    REQUEST_PREFILL_TIME,
    REQUEST_DECODE_TIME,
    REQUEST_PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS,
)
SPEC_DECODE_METRICS = (
    SPEC_DECODE_DRAFTS,
    SPEC_DECODE_DRAFT_TOKENS,
    SPEC_DECODE_ACCEPTED_TOKENS,
    SPEC_DECODE_ACCEPTED_PER_POSITION,
)

# Label keys of those metrics, which dashboards group by.
MODEL_NAME_LABEL = "model_name"  # the first --served-model-name
FINISH_REASON_LABEL = "finish_reason"  # of REQUESTS_FINISHED: stop, length, abort
REJECT_REASON_LABEL = "reason"  # of REQUESTS_REJECTED: draining, not_ready, queue_full, shed
# Of REQUESTS_WAITING_BY_PRIORITY: the request field priority ("0" always; past the few most urgent
# values, "other").
PRIORITY_LABEL = "priority"
POSITION_LABEL = "position"  # of SPEC_DECODE_ACCEPTED_PER_POSITION: the draft position, from 0
LORA_NAME_LABEL = "lora_name"  # of LORA_REQUESTS
# Of LORA_REQUESTS_INFO, as vLLM names them: adapter names comma-separated, and --max-loras.
MAX_LORA_LABEL = "max_lora"
RUNNING_LORA_ADAPTERS_LABEL = "running_lora_adapters"
WAITING_LORA_ADAPTERS_LABEL = "waiting_lora_adapters"

# Set by the gateway route's shared rule (the operator's HTTPRoute): each sibling variant's model
# name and the gateway path that reaches it, "NAME:VARIANT=/PATH,...". A pod asked for a sibling's
# model name redirects the client there (server/admission.py).
VARIANT_ROUTES_HEADER = "X-Pagoda-Variant-Routes"
