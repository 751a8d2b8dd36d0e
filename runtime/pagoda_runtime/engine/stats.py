"""What the engine reports about itself: its load (for metrics and admission) and each step's timing.

Torch-free, so that the server and its test double share these types.
"""

from __future__ import annotations

import time
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

    @classmethod
    def of(cls, starts, new, num_sampled: int) -> StepShape:
        """The shape of a batch whose sequence i computes new[i] tokens after its first starts[i]
        (numpy integer arrays: the model runner has them)."""
        # Query j of a chunk sees the start tokens before it, itself and the chunk's earlier ones.
        pairs = new * starts + new * (new + 1) // 2
        return cls(int(new.sum()), num_sampled, int((starts + new).sum()), int(pairs.sum()))


@dataclass(frozen=True)
class StepTiming:
    """Where one step's wall time went, phase by phase (StepClock). In order, the device waits
    while the host schedules, prepares, appends and emits; with async scheduling the host does all
    of that while the device computes the step launched before, and the device waits only for
    what takes longer than that step (then `wait_s` is about zero)."""

    num_seqs: int
    shape: StepShape
    overlapped: bool  # async scheduling
    schedule_s: float
    prepare_s: float  # building the batch's tensors and copying them over
    launch_s: float  # queueing the forward and the sampling; a CPU computes them here
    wait_s: float  # waiting for the device's tokens
    append_s: float  # appending the tokens, with the stop rules that need no text
    sample_s: float  # queueing a sampling that needed the previous step's tokens (async scheduling)
    emit_s: float  # text, stop strings and the outputs

    @property
    def host_s(self) -> float:
        """The host's own work in the step."""
        return self.schedule_s + self.prepare_s + self.append_s + self.sample_s + self.emit_s

    @property
    def wall_s(self) -> float:
        return self.host_s + self.launch_s + self.wait_s

    @property
    def host_fraction(self) -> float:
        """The host's share of the step: what the device waits on in order; with async scheduling
        a share below 1 means the host kept ahead of the device."""
        return self.host_s / self.wall_s if self.wall_s else 0.0


class StepClock:
    """Times a step phase by phase, in the order the phases run: `lap(phase)` ends the phase that
    began at the previous lap (or at the start) and adds its time to that phase's."""

    PHASES = ("schedule", "launch", "wait", "append", "sample", "emit")

    def __init__(self) -> None:
        self.phases = dict.fromkeys(self.PHASES, 0.0)
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] += now - self._last
        self._last = now

    def timing(self, num_seqs: int, shape: StepShape, overlapped: bool, prepare_s: float) -> StepTiming:
        """`prepare_s`: the part of the launch that built the batch's tensors (the runner times it)."""
        p = self.phases
        return StepTiming(
            num_seqs=num_seqs,
            shape=shape,
            overlapped=overlapped,
            schedule_s=p["schedule"],
            prepare_s=prepare_s,
            launch_s=p["launch"] - prepare_s,
            wait_s=p["wait"],
            append_s=p["append"],
            sample_s=p["sample"],
            emit_s=p["emit"],
        )
