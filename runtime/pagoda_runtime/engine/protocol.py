"""The contract between the HTTP server and the engine it serves from, typed once.

`AsyncLLMEngine` satisfies it, and so does the server tests' fake engine; the server is typed
against this Protocol only. Torch-free, so the server's types never pull in the model. A request
the engine will not run surfaces as `RequestRejected` from `generate`, before its first output;
one it accepted but could not finish, as `RequestFailed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.memory_report import MemoryReport
from pagoda_runtime.engine.outputs import RequestOutput
from pagoda_runtime.engine.request_validation import RequestRejected
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.stats import EngineStats

__all__ = [
    "ChatTokenizer",
    "EngineStats",
    "LoraAdapterError",
    "LoraNotFound",
    "RequestFailed",
    "RequestRejected",
    "ServedLora",
    "ServingEngine",
]


@dataclass(frozen=True)
class ServedLora:
    """A served LoRA adapter as /v1/models lists it."""

    parent: str | None  # the base model name it declared; None: the served model
    root: str  # the folder or source it was loaded from, as given (vLLM's card `root`)


class LoraAdapterError(ValueError):
    """A LoRA adapter that cannot be served here (its folder, its fit to the model, its name taken);
    the message says why and what to do. The server answers 400."""


class LoraNotFound(KeyError):
    """No served LoRA adapter has this name; the server answers 404."""

    def __str__(self) -> str:
        return f"The LoRA adapter '{self.args[0]}' is not loaded."


class RequestFailed(RuntimeError):
    """An accepted request the engine could not finish: a step that ran it raised (the engine serves
    on without it), or the engine itself stopped. Not the client's fault: the server answers 500."""


class ChatTokenizer(Protocol):
    chat_template: str | None  # the server's --chat-template replaces the model's own

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_pair(self, first: str, second: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_variables: Any,
    ) -> str: ...


@runtime_checkable
class ServingEngine(Protocol):
    @property
    def tokenizer(self) -> ChatTokenizer: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def sampling_defaults(self) -> dict[str, float]:
        """The model's recommended sampling (its generation_config.json), for what a request leaves out."""
        ...

    @property
    def vocab_size(self) -> int:
        """Token ids the model accepts: [0, vocab_size)."""
        ...

    @property
    def memory(self) -> MemoryReport: ...

    @property
    def scheduling_policy(self) -> str:
        """fcfs or priority (contract.config.SCHEDULING_POLICIES)."""
        ...

    @property
    def pooling_task(self) -> str | None:
        """What it makes of prompts under --runner pooling (contract/pooling.POOLING_TASKS: the
        PoolingParams.task it serves); None where it generates."""
        ...

    @property
    def class_labels(self) -> tuple[str, ...]:
        """A sequence classifier's label names, in the order of its probabilities; () otherwise."""
        ...

    @property
    def errored(self) -> BaseException | None:
        """Why the engine loop stopped; None while it runs."""
        ...

    @property
    def last_heartbeat(self) -> float:
        """time.monotonic() of the loop's last turn."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        request_id: str,
        internal: bool = False,
        priority: int = 0,
        lora_name: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request until it finishes; `internal` ones (the readiness
        canary) are left out of stats(). `priority`: lower first under the priority policy; a
        non-zero one under fcfs is rejected (request_validation.check_priority). `lora_name`: a
        served LoRA adapter to run with."""
        ...

    def lora_adapters(self) -> dict[str, ServedLora]:
        """Every served LoRA adapter by name."""
        ...

    async def add_lora(self, name: str, path: str) -> None:
        """Serve a PEFT adapter folder as `name`; LoraAdapterError when it cannot be served."""
        ...

    async def remove_lora(self, name: str) -> None:
        """Stop serving `name` (LoraNotFound if it is not served); its running requests finish."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def abort_all(self) -> None: ...

    def stats(self) -> EngineStats: ...
