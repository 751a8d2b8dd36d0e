"""What the server knows while it runs: its settings, the engine once loaded, drain and health."""

from __future__ import annotations

from dataclasses import dataclass

from pagoda_runtime.engine.protocol import EngineStats, ServingEngine
from pagoda_runtime.server.drain import Drain
from pagoda_runtime.server.health import Health
from pagoda_runtime.server.metrics import ServerMetrics

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str
    api_key: str | None = None
    max_num_seqs: int = 256  # the engine's batch: accepted requests beyond it wait
    max_queue: int | None = None  # waiting requests beyond which new ones get 429; None: the default
    drain_timeout: float = 30.0
    canary_interval: float = 10.0
    canary_timeout: float = 60.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    served_model_aliases: tuple[str, ...] = ()  # further names clients may use (--served-model-name a b)
    tool_call_parser: str = "hermes"  # how tool_choice "auto" finds calls in the text (tool_parsers)
    chat_template: str | None = None  # replaces the model's own (--chat-template)
    allowed_origins: tuple[str, ...] = ()  # CORS; empty: no CORS headers at all
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    metrics_compat: str | None = None  # "vllm": also export vLLM's metric names

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *self.served_model_aliases)


class ServerState:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: ServingEngine | None = None  # once loaded and started
        self.load_error: str | None = None
        self.drain = Drain(settings.drain_timeout)
        self.health = Health(settings.canary_interval, settings.canary_timeout)
        self.metrics = ServerMetrics(settings.served_model_name, self.engine_stats)

    def engine_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None
