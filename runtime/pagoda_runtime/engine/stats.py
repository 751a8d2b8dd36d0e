"""What the engine reports about itself: its load (for metrics and admission) and each step's timing.

Torch-free, so that the server and its test double share these types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int  # requests with no sample running
    num_running: int  # requests with at least one sample running
    kv_cache_usage: float  # fraction of KV blocks in use
    prefix_cache_queries: int  # cumulative, in prompt tokens
    prefix_cache_hits: int  # cumulative, in prompt tokens
    num_preemptions: int  # cumulative
    num_failed_steps: int = 0  # cumulative: steps that raised, failing only their own requests


@dataclass(frozen=True)
class StepShape:
    """What one step computed, in the terms a roofline counts (bench/roofline.py)."""

    num_tokens: int  # tokens run through the model
    num_sampled: int  # sequences whose next token is sampled: the rows the LM head computes
    context_tokens: int  # KV entries attention reads: every sequence's context up to its last new token
    attended_pairs: int  # (query, key) pairs attention scores, causal within a prefill chunk


@dataclass(frozen=True)
class StepTiming:
    """Where one step's wall time went; the host parts are what the GPU may wait on."""

    num_seqs: int
    shape: StepShape
    schedule_s: float
    prepare_s: float  # building the batch tensors
    execute_s: float  # the model and the sampler, including waiting for the device
    output_s: float  # appending tokens, stop rules, detokenizing, while the device waits
    # Output work done while a launched step ran on the device (async output processing): hidden
    # from the device unless it outlasts that step, when the next step's wait comes out shorter.
    overlapped_s: float = 0.0

    @property
    def host_s(self) -> float:
        """The host time the device waits on."""
        return self.schedule_s + self.prepare_s + self.output_s

    @property
    def host_fraction(self) -> float:
        total = self.schedule_s + self.execute_s + self.output_s + self.overlapped_s
        return self.host_s / total if total else 0.0
