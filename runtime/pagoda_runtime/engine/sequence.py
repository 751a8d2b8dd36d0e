"""One sample of one request as the scheduler sees it: its tokens, its blocks, how far it has run.

A request with n samples is n sequences sharing a `group`; the first one (index 0) prefills the
prompt and the others fork its prompt blocks once that prefill is done. A token sampled in a
launched step is counted in `num_tokens` (as pending) from the launch on, and joins `token_ids`
when the host reads it: with async scheduling the next step is planned and launched before then,
its input id taken from the device. Plain Python: the scheduler and the block manager read this
without torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pagoda_runtime.engine.bad_words import BadWords
from pagoda_runtime.engine.sampling_params import SamplingParams

_next_seq_id = itertools.count()


@dataclass(frozen=True)
class LoraRequest:
    """The LoRA adapter a request runs with, as vLLM names it. lora_int_id is new at every load, so
    an adapter loaded again under the same name never shares KV blocks with its earlier weights."""

    lora_name: str
    lora_int_id: int


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SequenceGroup:
    """What the samples of one request share."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    seqs: list[Sequence] = field(default_factory=list)
    priority: int = 0  # lower is served first under the priority policy (engine/priority.py)
    lora: LoraRequest | None = None  # None: the base model
    bad_words: BadWords | None = None  # the tokens of params.bad_words


class Sequence:
    def __init__(self, group: SequenceGroup, index: int, max_model_len: int | None = None) -> None:
        self.seq_id = next(_next_seq_id)
        self.group = group
        self.index = index
        self.token_ids = list(group.prompt_token_ids)  # the tokens the host knows
        self.num_prompt_tokens = len(self.token_ids)
        # Sampled in a launched step, not yet read by the host: one (one step is in flight), or the
        # tokens a verify step emitted while the engine appends them (Scheduler.accept).
        self.num_pending = 0
        # The length at which the sample ends (max_tokens, or the context), whatever it samples.
        max_tokens = group.params.max_tokens
        ends = (max_model_len, None if max_tokens is None else self.num_prompt_tokens + max_tokens)
        self.max_num_tokens: int | None = min((n for n in ends if n is not None), default=None)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # Of a model whose sliding-window layers keep their KV in a pool of their own: those
        # layers' blocks (engine/window_block_manager.py).
        self.window_block_table: list[int] = []
        # Chained prefix hashes of this sequence's full blocks, extended as blocks fill up.
        self.block_hashes: list[int] = []
        # What roots its prefix-cache hash chain with the adapter (block_manager.py): the request's
        # cache_salt, or what else a proposer's KV depends on.
        self.cache_salt: object = group.params.cache_salt
        self.num_computed_tokens = 0  # tokens whose keys and values are in the cache
        # A hybrid model's recurrent state slot while the sequence holds blocks (state_block_manager.py).
        self.state_slot = -1
        self.num_cached_tokens = 0  # of the prompt, found in the prefix cache at first admission
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # The llguidance matcher of a constrained sample (grammar_mask), fed each sampled token.
        self.grammar: Any = None

    @property
    def params(self) -> SamplingParams:
        return self.group.params

    @property
    def num_tokens(self) -> int:
        """Known and pending tokens: how long the sequence is on the device."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens the host knows."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def last_token_sampled(self) -> bool:
        """Whether the token that reaches max_tokens or the context is sampled (read or pending):
        nothing is left to compute."""
        return self.max_num_tokens is not None and self.num_tokens >= self.max_num_tokens

    @property
    def last_token_read(self) -> bool:
        """Whether the host has read that token: the sample ends with finish_reason length."""
        return self.max_num_tokens is not None and len(self.token_ids) >= self.max_num_tokens

    def append_read_token(self, token: int) -> None:
        """The host has read a pending token."""
        self.num_pending -= 1
        self.token_ids.append(token)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def leader(self) -> Sequence:
        return self.group.seqs[0]

    def __repr__(self) -> str:
        return (
            f"Sequence({self.group.request_id}#{self.index}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status.value})"
        )
