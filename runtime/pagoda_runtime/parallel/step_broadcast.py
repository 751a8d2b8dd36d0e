"""One step's inputs, from rank 0 (which schedules) to every other rank of the tensor-parallel group.

Rank 0 flattens a scheduled batch into the tensors the forward reads (model_runner.py) and sends
them as two broadcasts over the group's own backend: a fixed header of twelve integers (what kind
of message, and the sizes), then one int64 tensor holding every field end to end (each token's
LoRA slot too, when the step has adapter tokens; each sequence's recurrent state slot and fresh
flag, for a hybrid model). Between steps it sends the LoRA adapters it puts
in device slots (lora_broadcast.py), which every rank puts in the same slot before the next step.
Nothing is pickled, the same path works between processes of one machine and between pods (gloo
on the CPU, NCCL on GPUs, where the tensors never leave the device), and the other ranks rebuild
exactly the tensors rank 0 runs on, so every rank takes the same path (eager or CUDA graph) and
calls the same collectives in the same order. A speculative-decoding draft model is sharded over the
same ranks: its forwards go the same way, marked DRAFT_STEP (DraftStepSender), and each rank runs
them on its shard of the draft. An EAGLE head is whole on every rank and its steps go the same way,
with a third broadcast: the hidden state it takes per token (the head's inputs, which only rank 0's
proposer knows), in the model's dtype.

Rank 0 holds a lock over each step, from the send to the last collective of its forward, and
sends a keepalive whenever no step went out for a while: a waiting rank then only ever waits
for a live rank 0 for a short time, and the group's timeout (--distributed-timeout) tells a dead
or stuck peer from an idle server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.devices import host_list_on
from pagoda_runtime.parallel.lora_broadcast import LoraLoad, num_values, pack, unpack
from pagoda_runtime.parallel.tensor_parallel import TensorParallel

KEEPALIVE, STEP, STOP, LORA, DRAFT_STEP = 0, 1, 2, 3, 4
_HEADER_LEN = 12
# Rank 0 sends a keepalive after this long without a step, and at least four within a timeout.
MAX_KEEPALIVE_INTERVAL_S = 10.0


@dataclass(frozen=True)
class StepInputs:
    """What every rank needs for one forward: the flat batch and which rows' logits to compute."""

    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    meta: AttentionMetadata
    logits_rows: torch.Tensor  # int64 [rows]: token rows whose logits are computed (and sampled)
    replayable: bool  # padded to a captured CUDA graph's batch size, which every rank replays
    # int32 [num_tokens]: each token's LoRA slot (-1: the base model); None when no token has one.
    lora_slots: torch.Tensor | None = None
    # [real tokens, width]: the hidden state an EAGLE head takes beside each token; None for others.
    token_states: torch.Tensor | None = None


def keepalive_interval(timeout_s: float) -> float:
    return min(MAX_KEEPALIVE_INTERVAL_S, timeout_s / 4)


def _header(kind: int, step: StepInputs | None = None) -> list[int]:
    if step is None:
        return [kind] + [0] * (_HEADER_LEN - 1)
    meta = step.meta
    return [
        kind,
        step.input_ids.shape[0],
        meta.num_seqs,
        meta.block_tables.shape[1],
        meta.max_query_len,
        meta.max_seq_len,
        step.logits_rows.shape[0],
        int(step.replayable),
        int(step.lora_slots is not None),
        *((0, 0) if step.token_states is None else step.token_states.shape),
        int(meta.state_slots is not None),
    ]


def _payload(step: StepInputs) -> torch.Tensor:
    meta = step.meta
    parts = (
        step.input_ids,
        step.positions,
        meta.slot_mapping,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables.reshape(-1),
        step.logits_rows,
        *(() if step.lora_slots is None else (step.lora_slots,)),
        *(() if meta.state_slots is None else (meta.state_slots, meta.state_fresh)),
    )
    return torch.cat([part.to(torch.int64) for part in parts])


def _unpack(header: list[int], payload: torch.Tensor) -> StepInputs:
    _, num_tokens, num_seqs, width, max_query_len, max_seq_len, num_rows, replayable, lora = header[:9]
    sizes = [num_tokens, num_tokens, num_tokens, num_seqs + 1, num_seqs, num_seqs * width, num_rows]
    sizes.append(num_tokens * lora)
    # A hybrid model's recurrent state slots and fresh flags (padding sequences included).
    states = header[11]
    sizes += [num_seqs * states, num_seqs * states]
    parts = payload.split(sizes)
    input_ids, positions, slots, query_start, seq_lens, tables, rows, lora_slots, state_slots, fresh = parts
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=query_start.to(torch.int32),
        seq_lens=seq_lens.to(torch.int32),
        block_tables=tables.to(torch.int32).reshape(num_seqs, width),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )
    if states:
        meta.state_slots, meta.state_fresh = state_slots, fresh.to(torch.bool)
    return StepInputs(
        input_ids, positions, meta, rows, bool(replayable), lora_slots.to(torch.int32) if lora else None
    )


class StepSender:
    """Rank 0's side. `on_failure` hears why a send or a step's collectives failed; in a server it
    ends the process (the group cannot go on), so it does not return."""

    def __init__(
        self,
        tp: TensorParallel,
        device: torch.device,
        keepalive_s: float,
        on_failure: Callable[[str], None],
    ) -> None:
        self._tp = tp
        self._device = device
        self._keepalive_s = keepalive_s
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._last_sent = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="pagoda-step-keepalive", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def sending(self, step: StepInputs, kind: int = STEP) -> Iterator[None]:
        """Send `step` (a forward of the target model, or of the draft's with DRAFT_STEP), then hold
        the group for the body (the forward's collectives)."""
        with self._lock:
            try:
                self._send(_header(kind, step))
                dist.broadcast(_payload(step), group_src=0, group=self._tp.group)
                if step.token_states is not None:
                    dist.broadcast(step.token_states.contiguous(), group_src=0, group=self._tp.group)
                yield
            except Exception as exc:
                self._on_failure(f"rank 0: a step of the tensor-parallel group failed: {_describe(exc)}")
                raise
            self._last_sent = time.monotonic()

    def send_lora(self, load: LoraLoad) -> None:
        """Put an adapter in a device slot of every other rank, before the next step."""
        with self._lock:
            try:
                index, values = pack(load, self._device)
                self._send([LORA, load.slot, index.shape[0]] + [0] * (_HEADER_LEN - 3))
                dist.broadcast(index, group_src=0, group=self._tp.group)
                dist.broadcast(values, group_src=0, group=self._tp.group)
            except Exception as exc:
                self._on_failure(f"rank 0: sending a LoRA adapter to the group failed: {_describe(exc)}")
                raise
            self._last_sent = time.monotonic()

    def stop(self) -> None:
        """Tell every rank to exit (after a drain); no step may follow."""
        self._stopped.set()
        with self._lock:
            self._send(_header(STOP))
        self._thread.join()

    def _send(self, header: list[int]) -> None:
        # From pinned memory: a plain copy to the GPU would wait for the steps still queued there,
        # which async scheduling launches ahead of.
        dist.broadcast(host_list_on(self._device, header, torch.int64), group_src=0, group=self._tp.group)

    def _keep_alive(self) -> None:
        while not self._stopped.wait(self._keepalive_s / 2):
            with self._lock:
                if self._stopped.is_set() or time.monotonic() - self._last_sent < self._keepalive_s:
                    continue
                try:
                    self._send(_header(KEEPALIVE))
                except Exception as exc:
                    self._on_failure(f"rank 0: the tensor-parallel group stopped answering: {_describe(exc)}")
                    return
                self._last_sent = time.monotonic()


class DraftStepSender:
    """What a draft model's runner sends its steps through on rank 0: the target's sender, under
    the same lock and in one order with the target's steps, each marked for the draft's runner."""

    def __init__(self, sender: StepSender) -> None:
        self._sender = sender

    def sending(self, step: StepInputs) -> contextlib.AbstractContextManager[None]:
        return self._sender.sending(step, DRAFT_STEP)


class StepReceiver:
    """The other ranks' side: the next step and its kind (STEP for the target model, DRAFT_STEP for
    the draft's), skipping keepalives; None once rank 0 says stop. A LoRA adapter that comes
    between steps goes to `on_lora` (ModelRunner.receive_lora); `dtype`: the model's, that of an
    EAGLE head's token states."""

    def __init__(
        self,
        tp: TensorParallel,
        device: torch.device,
        on_lora: Callable[[LoraLoad], None],
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self._tp = tp
        self._device = device
        self._on_lora = on_lora
        self._dtype = dtype

    def receive(self) -> tuple[int, StepInputs] | None:
        while True:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self._device)
            dist.broadcast(header, group_src=0, group=self._tp.group)
            fields = header.tolist()
            if fields[0] == STOP:
                return None
            if fields[0] in (STEP, DRAFT_STEP):
                break
            if fields[0] == LORA:
                self._receive_lora(fields[1], fields[2])
        size = 3 * fields[1] + 2 * fields[2] + 1 + fields[2] * fields[3] + fields[6] + fields[1] * fields[8]
        size += 2 * fields[2] * fields[11]
        payload = torch.empty(size, dtype=torch.int64, device=self._device)
        dist.broadcast(payload, group_src=0, group=self._tp.group)
        step = _unpack(fields, payload)
        if fields[9]:
            states = torch.empty(fields[9], fields[10], dtype=self._dtype, device=self._device)
            dist.broadcast(states, group_src=0, group=self._tp.group)
            step = dataclasses.replace(step, token_states=states)
        return fields[0], step

    def _receive_lora(self, slot: int, rows: int) -> None:
        index = torch.empty(rows, 5, dtype=torch.int64, device=self._device)
        dist.broadcast(index, group_src=0, group=self._tp.group)
        values = torch.empty(num_values(index.cpu()), dtype=torch.float32, device=self._device)
        dist.broadcast(values, group_src=0, group=self._tp.group)
        self._on_lora(unpack(slot, index, values))


def _describe(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())
