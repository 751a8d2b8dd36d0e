"""What `pagoda-runtime serve` takes beside the engine's config: the HTTP server's settings and where
the ranks of a tensor-parallel group meet. Each field with a flag is a `serve` flag (flags.py), and
the operator renders the ones an InferenceService sets from these same fields.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.flags import default_of, setting
from pagoda_runtime.contract.names import (
    API_KEY_ENV,
    DISTRIBUTED_PORT,
    HTTP_PORT,
    LWS_LEADER_ADDRESS,
    TERMINATION_LOG,
)

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# Without --max-queue, a burst may wait behind this many full batches before new requests get 429.
DEFAULT_QUEUE_BATCHES = 2
# How tool_choice "auto" finds calls in the generated text (server/tool_parsers.py).
TOOL_CALL_PARSERS = (
    "hermes",
    "llama3_json",
    "openai",
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "qwen3_coder",
    "minimax_m2",
    "mistral",
    "pythonic",
    "llama4_pythonic",
    "kimi_k2",
)
# vLLM's --generation-config: auto takes the model's generation_config.json sampling as the defaults
# of what a request leaves out; vllm keeps the API's own defaults.
GENERATION_CONFIGS = ("auto", "vllm")
# vLLM's --reasoning-parser names; all but openai_gptoss (harmony) read <think>...</think>
# (server/reasoning.py): DeepSeek R1 and V3.1, Qwen3, GLM-4.5, MiniMax-M2.
REASONING_PARSERS = ("deepseek_r1", "deepseek_v3", "qwen3", "glm45", "minimax_m2", "kimi_k2", "openai_gptoss")
# --metrics-compat: whose metric names are exported a second time (server/metrics_compat.py).
METRICS_COMPAT_CHOICES = ("vllm",)
LOG_FORMATS = ("text", "json")
# The longest a rank waits for the others: to join the group, to load the model everywhere, and
# for any one step's collective. A 70B checkpoint loads on every rank at once, so the skew
# between ranks is what counts, not the load itself.
DEFAULT_DISTRIBUTED_TIMEOUT_S = 300.0


def parse_names(value: str) -> tuple[str, ...]:
    """A list flag as vLLM takes it (a JSON list) or comma-separated."""
    if value.lstrip().startswith("["):
        try:
            names = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from exc
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise argparse.ArgumentTypeError("give a JSON list of strings")
        return tuple(names)
    return tuple(name.strip() for name in value.split(",") if name.strip())


def read_chat_template(value: str) -> str:
    """--chat-template: a file's contents, or the template itself (as vLLM reads it)."""
    path = Path(value).expanduser()
    return path.read_text() if path.is_file() else value


def parse_pipeline_parallel_size(value: str) -> int:
    if value.strip() != "1":
        raise argparse.ArgumentTypeError(
            f"{value} is not supported: Pagoda splits a model over GPUs and nodes by tensor parallelism "
            "only, so give the total GPU count as --tensor-parallel-size and leave this at 1"
        )
    return 1


@dataclass(frozen=True)
class ServerSettings:
    """The serving process beside its engine: where it listens, the names it answers to, how it
    sheds load and drains, and how it logs. The fields without a flag are set by the caller."""

    served_model_names: tuple[str, ...] = setting(
        (),
        "the names clients may use; the first one labels the metrics (default: --model)",
        name="--served-model-name",
        many=True,
    )
    host: str = setting("0.0.0.0", "address the HTTP server listens on")
    port: int = setting(HTTP_PORT, "port the HTTP server listens on")
    api_key: str | None = setting(None, f"require this bearer key on /v1/* (or set {API_KEY_ENV})")
    # The engine's batch (its --max-num-seqs): accepted requests beyond it wait.
    max_num_seqs: int = default_of(EngineConfig, "max_num_seqs")
    max_queue: int | None = setting(
        None,
        "requests waiting beyond a full batch (--max-num-seqs) after which new ones get HTTP 429 "
        f"with Retry-After; unset: {DEFAULT_QUEUE_BATCHES} x --max-num-seqs",
    )
    drain_timeout: float = setting(
        30.0, "seconds to finish accepted requests after SIGTERM before the process exits"
    )
    canary_interval: float = setting(
        10.0, "seconds between the readiness canaries (a few greedy tokens through the engine)"
    )
    canary_timeout: float = 60.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    enable_auto_tool_choice: bool = setting(
        True,
        "answer tool_choice auto (or tools without a tool_choice) by reading the model's own calls with "
        "--tool-call-parser; vLLM's flag, on by default here: --no-enable-auto-tool-choice makes such a "
        "request a 400",
    )
    tool_call_parser: str | None = setting(
        None,
        "how tool calls are found in the text for tool_choice auto: hermes (<tool_call> JSON, "
        "Qwen2.5/Qwen3/SmolLM/Hermes), llama3_json (Llama 3.x), openai (GPT-OSS's harmony messages to "
        "functions.NAME), deepseek_v3 (DeepSeek V3 and R1), deepseek_v31 (DeepSeek V3.1 and later), "
        "glm45 (GLM-4.5 and 4.6), qwen3_coder (Qwen3-Coder's XML), minimax_m2 (MiniMax-M2), mistral "
        "([TOOL_CALLS]: Mistral Small, Nemo, Devstral) or pythonic ([f(x=1)]: Llama 3.2 and 4; vLLM's "
        "llama4_pythonic reads as it); default: "
        "openai under --reasoning-parser openai_gptoss, hermes otherwise",
        choices=TOOL_CALL_PARSERS,
    )
    generation_config: str = setting(
        "auto",
        "auto: a request's temperature, top_p, top_k, min_p and repetition_penalty default to the "
        "model's generation_config.json (as vLLM); vllm: to the API's defaults (temperature 1, ...)",
        choices=GENERATION_CONFIGS,
    )
    reasoning_parser: str | None = setting(
        None,
        "tell a reasoning model's thinking (<think>...</think>: deepseek_r1, deepseek_v3, qwen3, glm45, "
        "minimax_m2; openai_gptoss: GPT-OSS's harmony analysis channel) from its answer: chat replies "
        "carry it as reasoning_content (and reasoning), the Responses API as a reasoning item; default: off",
        choices=REASONING_PARSERS,
    )
    chat_template: str | None = setting(
        None,
        "a Jinja chat template, or a file holding one, to use instead of the model's own",
        parse=read_chat_template,
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        "CORS origins allowed, as a JSON list or comma-separated (e.g. '[\"*\"]'); default: no CORS",
        parse=parse_names,
    )
    allowed_methods: tuple[str, ...] = setting(
        ("*",), "CORS methods allowed (default: all)", parse=parse_names
    )
    allowed_headers: tuple[str, ...] = setting(
        ("*",), "CORS headers allowed (default: all)", parse=parse_names
    )
    allow_credentials: bool = setting(False, "CORS: allow credentials")
    return_tokens_as_token_ids: bool = setting(
        False,
        "show each token in logprobs as token_id:<id> (what a request's return_tokens_as_token_ids "
        "asks), so that a token that is not text alone (part of a UTF-8 character) can be told apart",
    )
    metrics_compat: str | None = setting(
        None,
        "also export the metrics under vLLM's names (vllm:num_requests_waiting, ...) for existing "
        "dashboards and autoscaling rules",
        choices=METRICS_COMPAT_CHOICES,
    )
    termination_log: str | None = setting(
        None, f"file for a fatal start-up error (default: {TERMINATION_LOG} when writable)"
    )
    log_format: str = setting(
        "text", "text, or json: one object per line, for log collectors", choices=LOG_FORMATS
    )
    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR")
    model: str | None = None  # --model, the base model's card's root in /v1/models

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    def __post_init__(self) -> None:
        # Harmony's tool calls are read from the channels its special tokens mark, which only the
        # harmony reasoning parser keeps in the text; and under it, no other format is written.
        chosen = self.tool_call_parser
        if chosen is not None and (chosen == "openai") != (self.reasoning_parser == "openai_gptoss"):
            reasoning = self.reasoning_parser
            given = f"--reasoning-parser {reasoning}" if reasoning else "no --reasoning-parser"
            raise ValueError(
                f"--tool-call-parser {chosen} does not go with {given}: GPT-OSS's harmony format takes "
                "--tool-call-parser openai with --reasoning-parser openai_gptoss, other models neither"
            )

    @property
    def tool_parser(self) -> str:
        """The tool-call parser in effect (tool_call_parser's default resolved)."""
        if self.tool_call_parser is not None:
            return self.tool_call_parser
        return "openai" if self.reasoning_parser == "openai_gptoss" else "hermes"

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.served_model_names


@dataclass(frozen=True)
class DistributedSettings:
    """Where the ranks of one group meet (parallel/world_layout.py); the group's size is the
    engine's tensor_parallel_size."""

    pipeline_parallel_size: int = setting(
        1,
        "accepted for vLLM's command lines; only 1 (docs/architecture.md#multi-process-and-multi-node)",
        short="-pp",
        parse=parse_pipeline_parallel_size,
    )
    distributed_port: int = setting(
        DISTRIBUTED_PORT,
        f"TCP port where the ranks meet on the leader ({LWS_LEADER_ADDRESS}, or this machine)",
    )
    distributed_timeout: float = setting(
        DEFAULT_DISTRIBUTED_TIMEOUT_S,
        "seconds a rank waits for the others (to join, to load, within a step) before the process "
        "exits non-zero",
    )
