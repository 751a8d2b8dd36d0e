"""Which LoRA adapters the engine serves, which are in host memory and which sit in device slots.

- served: every adapter loaded by name (--lora-modules at start, POST /v1/load_lora_adapter live),
  from a folder or an hf:// or s3:// source downloaded first (loading/lora_source.py), each with a
  lora_int_id new at every load; a request holds its adapter (`acquire`) until it ends
  (`release`), and an adapter unloaded while requests hold it is gone for new requests at once and
  dropped when the last of them ends.
- host memory: up to --max-cpu-loras adapters as ready-made slot tensors (pinned on a GPU), least
  recently used dropped first among those no request holds (while requests hold more, all of
  theirs stay); a dropped one is read from its folder again when a step needs it.
- device: --max-loras slots; `activate` puts the adapters of a step in slots before it runs,
  swapping out the least recently used adapter no request holds (else any not in this step). The
  scheduler lets no more than --max-loras adapters run at once, so a step always fits.
- tensor parallelism: this manager runs on rank 0 only. It keeps each adapter in host memory also
  whole, as read, and every swap into a device slot sends it to the other ranks, which cut their
  own shards (ModelRunner.load_lora); they keep nothing between swaps.

Thread-safe: the server loads and unloads from its event loop while the engine thread runs steps.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.engine.protocol import LoraAdapterError, LoraNotFound, ServedLora
from pagoda_runtime.engine.sequence import LoraRequest, Sequence
from pagoda_runtime.executor.models.lora_layers import LoraSlots
from pagoda_runtime.loading.lora_adapter import LoraAdapter, load_lora_adapter
from pagoda_runtime.loading.lora_source import adapter_folder
from pagoda_runtime.parallel.lora_broadcast import AdapterWeights


@dataclass(frozen=True)
class _HostCopy:
    weights: list  # this rank's slot tensors (LoraSlots.slot_weights)
    whole: AdapterWeights | None  # the adapter as read, for the other ranks; None without any


@dataclass
class _Adapter:
    lora: LoraRequest
    path: str
    served: ServedLora
    scaling: float
    users: int = 0
    unloading: bool = False


class LoraManager:
    def __init__(
        self,
        slots: LoraSlots,
        model_config: ModelConfig,
        max_loras: int,
        max_cpu_loras: int,
        load: Callable[[int, list, float, AdapterWeights | None], None],
        read: Callable[[str, str, ModelConfig, int], LoraAdapter] = load_lora_adapter,
        locate: Callable[[str, str], str] = adapter_folder,
    ) -> None:
        if max_cpu_loras < max_loras:
            raise ValueError(
                f"--max-cpu-loras {max_cpu_loras} is below --max-loras {max_loras}; host memory must "
                "hold at least the adapters on the device"
            )
        self.slots = slots
        self.model_config = model_config
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self._load = load  # (slot, slot tensors, scaling, whole adapter) -> on the device of every rank
        self._read = read
        self._locate = locate  # (name, path or source) -> the adapter's local folder
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._served: dict[str, _Adapter] = {}  # by name, the adapters new requests may name
        self._held: dict[int, _Adapter] = {}  # by id, every adapter a request may still run with
        self._host: OrderedDict[int, _HostCopy] = OrderedDict()  # by id, least recent first
        self._device: OrderedDict[int, int] = OrderedDict()  # id -> slot, least recent first
        self.num_swaps = 0  # host -> device copies
        self.num_reads = 0  # adapters read from their folders
        self.last_swap_s = 0.0

    # ---- what the server changes -------------------------------------------------------------

    def add(self, name: str, path: str, parent: str | None = None) -> LoraRequest:
        """Read, check and serve the adapter at `path` (a folder, or a source downloaded first) as
        `name`; LoraAdapterError if it cannot run here or the name is taken."""
        with self._lock:
            self._check_free(name)
        served = ServedLora(parent, path)
        path = self._locate(name, path)
        copy, scaling = self._read_slot_weights(name, path)
        with self._lock:
            self._check_free(name)
            entry = _Adapter(LoraRequest(name, next(self._ids)), path, served, scaling)
            self._served[name] = self._held[entry.lora.lora_int_id] = entry
            self.num_reads += 1
            self._keep_in_host(entry.lora.lora_int_id, copy)
            return entry.lora

    def remove(self, name: str) -> None:
        """Stop serving `name` (LoraNotFound if it is not served); its memory goes once no request
        holds it."""
        with self._lock:
            entry = self._served.pop(name, None)
            if entry is None:
                raise LoraNotFound(name)
            entry.unloading = True
            if entry.users == 0:
                self._drop(entry)

    def served(self) -> dict[str, ServedLora]:
        with self._lock:
            return {name: entry.served for name, entry in self._served.items()}

    # ---- what requests hold ------------------------------------------------------------------

    def acquire(self, name: str) -> LoraRequest:
        with self._lock:
            entry = self._served.get(name)
            if entry is None:
                raise LoraNotFound(name)
            entry.users += 1
            return entry.lora

    def release(self, lora: LoraRequest) -> None:
        with self._lock:
            entry = self._held.get(lora.lora_int_id)
            if entry is None:
                return
            entry.users -= 1
            if entry.users == 0 and entry.unloading:
                self._drop(entry)

    # ---- what a step needs -------------------------------------------------------------------

    def activate(self, ids: Iterable[int]) -> None:
        """Put the adapters `ids` (at most max_loras) in device slots."""
        wanted = set(ids)
        for lora_id in wanted:
            with self._lock:
                if lora_id in self._device:
                    self._device.move_to_end(lora_id)
                    continue
                entry = self._held[lora_id]
                copy = self._host.get(lora_id)
            read = copy is None
            if read:
                copy, _ = self._read_slot_weights(entry.lora.lora_name, entry.path)
            with self._lock:
                self.num_reads += read
                self._keep_in_host(lora_id, copy)
                slot = self._free_slot(wanted)
                started = time.perf_counter()
                self._load(slot, copy.weights, entry.scaling, copy.whole)
                self.last_swap_s = time.perf_counter() - started
                self._device[lora_id] = slot
                self.num_swaps += 1

    def slots_for(self, seqs: list[Sequence]) -> list[int] | None:
        """Each sequence's adapter slot (-1: the base model), its adapters put in device slots first;
        None when no sequence has an adapter."""
        adapters = {seq.group.lora.lora_int_id for seq in seqs if seq.group.lora is not None}
        if not adapters:
            return None
        self.activate(adapters)
        return [-1 if seq.group.lora is None else self._device[seq.group.lora.lora_int_id] for seq in seqs]

    @property
    def resident(self) -> list[str]:
        """The names of the adapters in device slots, least recently used first."""
        with self._lock:
            return [self._held[i].lora.lora_name for i in self._device]

    # ---- internals (under the lock, but for reading) -------------------------------------------

    def _read_slot_weights(self, name: str, path: str) -> tuple[_HostCopy, float]:
        adapter = self._read(name, path, self.model_config, self.slots.max_rank)
        try:
            weights = self.slots.slot_weights(name, adapter.weights)
        except ValueError as exc:
            raise LoraAdapterError(str(exc)) from exc
        whole = dict(adapter.weights) if self.slots.sharded else None
        return _HostCopy(weights, whole), adapter.scaling

    def _check_free(self, name: str) -> None:
        if name in self._served:
            raise LoraAdapterError(f"The LoRA adapter '{name}' has already been loaded; unload it first.")
        if any(e.lora.lora_name == name for e in self._held.values()):
            raise LoraAdapterError(
                f"The LoRA adapter '{name}' is being unloaded once its running requests finish; retry then."
            )

    def _free_slot(self, wanted: set[int]) -> int:
        taken = set(self._device.values())
        free = [s for s in range(self.max_loras) if s not in taken]
        if free:
            return free[0]
        idle = [i for i in self._device if i not in wanted and self._held[i].users == 0]
        victim = (idle or [i for i in self._device if i not in wanted])[0]
        return self._device.pop(victim)

    def _keep_in_host(self, lora_id: int, copy: _HostCopy) -> None:
        self._host[lora_id] = copy
        self._host.move_to_end(lora_id)
        while len(self._host) > self.max_cpu_loras:
            idle = [i for i in self._host if i != lora_id and self._held[i].users == 0]
            if not idle:
                break  # every adapter in host memory runs: keep them until one is released
            del self._host[idle[0]]

    def _drop(self, entry: _Adapter) -> None:
        lora_id = entry.lora.lora_int_id
        del self._held[lora_id]
        self._host.pop(lora_id, None)
        self._device.pop(lora_id, None)
