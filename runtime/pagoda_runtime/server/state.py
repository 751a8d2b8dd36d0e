"""What the server knows while it runs: its settings (contract/serve_settings.py), the engine once
loaded, drain and health."""

from __future__ import annotations

from pagoda_runtime.contract.serve_settings import ServerSettings
from pagoda_runtime.engine.protocol import EngineStats, ServingEngine
from pagoda_runtime.server.drain import Drain
from pagoda_runtime.server.health import Health
from pagoda_runtime.server.metrics import ServerMetrics
from pagoda_runtime.server.shedding import QueuedRequests


class ServerState:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.engine: ServingEngine | None = None  # once loaded and started
        self.load_error: str | None = None
        self.drain = Drain(settings.drain_timeout)
        self.health = Health(settings.canary_interval, settings.canary_timeout)
        self.queued = QueuedRequests()  # admitted, no output yet: what a full queue may shed
        self.metrics = ServerMetrics(settings.served_model_name, self.engine_stats)

    def engine_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None
