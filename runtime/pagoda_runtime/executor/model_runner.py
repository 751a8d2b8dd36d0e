"""The executor: the one place that knows devices. It builds the model and its paged KV cache,
turns a scheduled batch into flat tensors, runs the model and samples.

On CUDA, decode-only steps replay CUDA graphs captured once per batch-size bucket (1, 2, 4, 8, ...
up to max_num_seqs): the batch is padded to its bucket, padding tokens write to no slot (slot -1),
and the attention metadata lives in static buffers that each replay refills.

A model with sliding-window layers shorter than the context keeps their KV in a pool of its own
(sizing.kv_pools; the block manager frees the blocks behind each window), so a step carries a
second block table and slot mapping for those layers; where every layer slides there is one pool,
the window one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from pagoda_runtime.contract.config import KV_CACHE_DTYPES, EngineConfig, ModelConfig
from pagoda_runtime.contract.quantization_selection import cpu_packed_kernels, cpu_vocab_dtype
from pagoda_runtime.contract.sizing import (
    KVPools,
    kv_bytes_per_block,
    kv_heads_per_rank,
    kv_layer_bytes_per_token,
    kv_pools,
)
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.cpu_threads import configure_torch_threads
from pagoda_runtime.executor.devices import Placement, dtype_name, host_list_on, resolve_dtype
from pagoda_runtime.executor.kernels import get_attention_ops
from pagoda_runtime.executor.kernels.reference import FP8_KV_DTYPE
from pagoda_runtime.executor.models import build_model
from pagoda_runtime.executor.quantization.memory import decode_weight_bytes, model_weight_bytes
from pagoda_runtime.executor.sampler import DeviceSamples, Sampler, SamplerOutput
from pagoda_runtime.parallel.step_broadcast import StepInputs, StepSender
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

logger = logging.getLogger(__name__)

# A fractional --kv-cache-memory means a share of the GPU's free memory; a CPU has no such
# figure worth trusting (other processes, swap), so there the cache gets this fixed budget.
CPU_KV_CACHE_BYTES = 512 * 2**20


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV cache dtype {name!r}; use one of {', '.join(KV_CACHE_DTYPES)}")
    if name == "auto":
        return model_dtype
    # Triton has e4m3 ("fp8e4nv") loads and casts only from Ada and Hopper on.
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(
            f"--kv-cache-dtype fp8 needs a GPU of compute capability 8.9 or newer, but this one is "
            f"{major}.{minor}; use --kv-cache-dtype auto"
        )
    return FP8_KV_DTYPE


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 <= max_num_seqs:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


@dataclass
class LaunchedStep:
    batch: ScheduledBatch
    rows: list[int]  # indices into batch.seqs of the sequences that sample this step
    samples: DeviceSamples | None  # None when no row samples, and on every rank but 0

    def wait(self) -> SamplerOutput:
        """The samples, once the device has computed them."""
        return SamplerOutput([], []) if self.samples is None else self.samples.to_host()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        weights: Iterable[tuple[str, torch.Tensor]],
        engine_config: EngineConfig,
        placement: Placement,
        max_model_len: int,
        quantization: str,
        tp: TensorParallel = SINGLE_PROCESS,
    ) -> None:
        """quantization: the method the projections are built with (already checked against the
        checkpoint by quantization_selection.py); tp: this process's rank."""
        self.config = model_config
        self.tp = tp
        # This rank's KV cache holds only the KV heads its query heads read.
        self.num_kv_heads = kv_heads_per_rank(model_config.architecture.num_key_value_heads, tp.size)
        self.device = placement.device
        self.dtype = placement.dtype
        if self.device.type == "cpu":
            logger.info("CPU path: %d torch threads", configure_torch_threads())
        self.kv_cache_dtype = resolve_kv_cache_dtype(engine_config.kv_cache_dtype, self.dtype, self.device)
        self.block_size = engine_config.block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // self.block_size)
        self.model = build_model(
            model_config,
            get_attention_ops(self.device),
            max_model_len,
            quantization,
            self.device,
            self.dtype,
            tp,
        )
        self.model.load_weights(weights)
        if self.device.type == "cpu" and cpu_packed_kernels(engine_config.dtype):
            self.model.pack_for_cpu(resolve_dtype(cpu_vocab_dtype("cpu", engine_config.dtype), self.device))
        self.model.eval()
        self.weight_bytes = model_weight_bytes(self.model)
        self.decode_weight_bytes = decode_weight_bytes(self.model)  # what one decode step reads
        arch = model_config.architecture
        pools = self._kv_pools(engine_config)
        # Rank 0's block manager hands out block ids for every rank's cache: all hold as many.
        self.pools = KVPools(
            tp.agree_min(pools.full_blocks, self.device), tp.agree_min(pools.window_blocks, self.device)
        )
        # The blocks of the pool every layer without its own window uses (the window pool's where
        # every layer slides): what the block manager's tables (Sequence.block_table) name.
        self.num_blocks = self.pools.full_blocks or self.pools.window_blocks
        # Layers whose window keeps its KV in the window pool (the second table of a hybrid model).
        self.windowed = self.pools.window_blocks > 0 and self.pools.full_blocks > 0
        self.kv_caches = [
            torch.empty(
                2,
                self._layer_blocks(layer),
                self.block_size,
                self.num_kv_heads,
                arch.head_dim,
                device=self.device,
                dtype=self.kv_cache_dtype,
            )
            for layer in range(arch.num_hidden_layers)
        ]
        self.sampler = Sampler(self.device, model_config.eos_token_ids, engine_config.seed)
        self._graphs: dict[int, _Graph] = {}
        self._graph_pool = None
        self._max_graph_size = 0
        self.last_prepare_s = 0.0  # host time spent building the last step's tensors
        # The CUDA graph bucket the last forward replayed, None when it ran eagerly (profiles read it).
        self.last_graph_batch: int | None = None
        # Rank 0 of a tensor-parallel group: where each step goes to the other ranks first.
        self.step_sender: StepSender | None = None
        if self.device.type == "cuda" and not engine_config.enforce_eager:
            self._capture_graphs(engine_config.max_num_seqs)

    @property
    def kv_cache_dtype_name(self) -> str:
        return "fp8" if self.kv_cache_dtype == FP8_KV_DTYPE else dtype_name(self.kv_cache_dtype)

    @property
    def kv_bytes_per_block(self) -> int:
        rank_slice = self.config.architecture.per_rank(self.tp.size)
        return kv_bytes_per_block(rank_slice, self.block_size, self.kv_cache_dtype_name)

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer of this rank's cache, at the cache's dtype."""
        return self.kv_bytes_per_block // self.block_size

    @property
    def kv_cache_bytes(self) -> int:
        """What the KV caches of every layer occupy on this rank."""
        return sum(cache.numel() * cache.element_size() for cache in self.kv_caches)

    @property
    def window(self) -> int | None:
        """The sliding window whose layers keep only their window's blocks, None where none does."""
        return self.config.architecture.sliding_window if self.pools.window_blocks else None

    def _layer_blocks(self, layer: int) -> int:
        if self.pools.window_blocks and self.config.architecture.layer_window(layer) is not None:
            return self.pools.window_blocks
        return self.pools.full_blocks

    def _kv_pools(self, engine_config: EngineConfig) -> KVPools:
        rank_slice = self.config.architecture.per_rank(self.tp.size)
        budget = self._kv_budget(engine_config.kv_cache_memory, engine_config.gpu_memory_utilization)
        pools = kv_pools(
            rank_slice,
            budget,
            self.block_size,
            self.max_model_len,
            engine_config.max_num_seqs,
            engine_config.max_num_batched_tokens,
            self.kv_cache_dtype_name,
        )
        if pools.full_blocks or pools.window_blocks:
            return pools
        layer_block = self.block_size * kv_layer_bytes_per_token(rank_slice, self.kv_cache_dtype_name)
        raise ValueError(
            f"the KV cache budget of {budget} bytes holds no block of {layer_block} bytes per layer; "
            f"raise {self._budget_flag(engine_config)}"
        )

    @staticmethod
    def _budget_flag(engine_config: EngineConfig) -> str:
        if engine_config.gpu_memory_utilization is not None:
            return "--gpu-memory-utilization"
        return "--kv-cache-memory"

    def _kv_budget(self, kv_cache_memory: float, gpu_memory_utilization: float | None) -> int:
        if self.device.type == "cuda":
            # Loading leaves its transients (random draws, float copies of quantized weights) cached
            # by torch's allocator, which mem_get_info counts as used: give them back first.
            torch.cuda.empty_cache()
        flag = "--kv-cache-memory"
        if gpu_memory_utilization is not None:
            flag = "--gpu-memory-utilization"
            if self.device.type != "cuda" or not 0 < gpu_memory_utilization <= 1:
                raise ValueError(
                    f"--gpu-memory-utilization {gpu_memory_utilization} needs a GPU and a fraction in "
                    "(0, 1]; on a CPU size the KV cache with --kv-cache-memory"
                )
            free, total = torch.cuda.mem_get_info(self.device)
            # What is in use now (the weights, and anything else on the GPU) comes out of the share.
            budget = int(total * gpu_memory_utilization) - (total - free)
        elif kv_cache_memory > 1:
            budget = int(kv_cache_memory)
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * kv_cache_memory)
        else:
            budget = CPU_KV_CACHE_BYTES
        if budget < 1:
            raise ValueError(f"the KV cache budget is {budget} bytes; raise {flag}")
        return budget

    # ---- one step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> LaunchedStep:
        """Queue one step: its forward and its sampling. On CUDA this returns while the device
        still computes; LaunchedStep.wait reads the samples.

        With tensor parallelism every rank runs every step on the same batch (the forward and the
        logits are collectives); only rank 0 samples, the others get no samples."""
        started = time.perf_counter()
        sampling_rows = [i for i in range(len(batch)) if batch.samples(i)]
        step = self._prepare(batch, sampling_rows, replayable=True)
        self.last_prepare_s = time.perf_counter() - started
        logits = self.run(step)
        if logits is None or not self.tp.is_driver:
            return LaunchedStep(batch, [], None)
        return LaunchedStep(
            batch, sampling_rows, self.sampler(logits, [batch.seqs[i] for i in sampling_rows])
        )

    @torch.inference_mode()
    def score(self, seq: Sequence) -> torch.Tensor:
        """Float32 logits [num_tokens, vocab] after each token of `seq`, in one prefill; `seq` holds
        blocks for all its tokens and none of them is computed yet."""
        return self.run(self._prepare(ScheduledBatch([seq], [seq.num_tokens]), None, replayable=False))

    @torch.inference_mode()
    def run(self, step: StepInputs) -> torch.Tensor | None:
        """The forward and the float32 logits of step.logits_rows (None when there are none): what
        every rank of a group computes for a step. Rank 0 first sends the step to the others."""
        if self.step_sender is None:
            return self._forward(step)
        with self.step_sender.sending(step):
            return self._forward(step)

    def _forward(self, step: StepInputs) -> torch.Tensor | None:
        meta = step.meta
        if step.replayable and meta.is_decode_only and meta.num_seqs <= self._max_graph_size:
            hidden = self._replay(step.input_ids, step.positions, meta)
        else:
            self.last_graph_batch = None
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, meta)
        if step.logits_rows.shape[0] == 0:
            return None
        return self.model.compute_logits(hidden[step.logits_rows])

    def _prepare(
        self, batch: ScheduledBatch, sampling_rows: list[int] | None, replayable: bool
    ) -> StepInputs:
        """The step's flat tensors; logits for the last token of each of `sampling_rows`, or for
        every token when None (scoring)."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        seq_lens: list[int] = []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            query_start.append(query_start[-1] + num_new)
            seq_lens.append(end)
        width = max(len(seq.block_table) for seq in batch.seqs)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            query_start_loc=self._tensor(query_start, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            block_tables=self._tables([seq.block_table for seq in batch.seqs], width),
            max_query_len=max(batch.num_new_tokens),
            max_seq_len=max(seq_lens),
        )
        if self.windowed:
            meta.window_block_tables = self._tables([seq.window_block_table for seq in batch.seqs], width)
            meta.window_slot_mapping = self._tensor(
                [
                    seq.window_block_table[p // bs] * bs + p % bs
                    for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True)
                    for p in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new)
                ],
                torch.int64,
            )
        if sampling_rows is None:
            rows = list(range(len(input_ids)))
        else:
            rows = [query_start[i + 1] - 1 for i in sampling_rows]
        return StepInputs(
            self._tensor(input_ids, torch.int64),
            self._tensor(positions, torch.int64),
            meta,
            self._tensor(rows, torch.int64),
            replayable,
        )

    def _tensor(self, data: list[int], dtype: torch.dtype) -> torch.Tensor:
        return host_list_on(self.device, data, dtype)

    def _tables(self, tables: list[list[int]], width: int) -> torch.Tensor:
        flat: list[int] = []
        for table in tables:
            flat += table
            flat += [0] * (width - len(table))
        return self._tensor(flat, torch.int32).view(len(tables), width)

    # ---- CUDA graphs -------------------------------------------------------------------------

    def _capture_graphs(self, max_num_seqs: int) -> None:
        sizes = graph_batch_sizes(max_num_seqs)
        largest = sizes[-1]
        device = self.device
        self._static = {
            "input_ids": torch.zeros(largest, dtype=torch.int64, device=device),
            "positions": torch.zeros(largest, dtype=torch.int64, device=device),
            "slot_mapping": torch.full((largest,), -1, dtype=torch.int64, device=device),
            "query_start_loc": torch.arange(largest + 1, dtype=torch.int32, device=device),
            "seq_lens": torch.ones(largest, dtype=torch.int32, device=device),
            "block_tables": torch.zeros(largest, self.max_blocks_per_seq, dtype=torch.int32, device=device),
        }
        if self.windowed:
            self._static["window_slot_mapping"] = torch.full((largest,), -1, dtype=torch.int64, device=device)
            self._static["window_block_tables"] = torch.zeros_like(self._static["block_tables"])
        # Largest first, so that the smaller graphs fit in the memory pool the largest reserved.
        for size in reversed(sizes):
            meta = self._static_meta(size)
            args = (self._static["input_ids"][:size], self._static["positions"][:size], self.kv_caches, meta)
            self.model(*args)  # warm-up: Triton compiles outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                hidden = self.model(*args)
            if self._graph_pool is None:
                self._graph_pool = graph.pool()
            self._graphs[size] = _Graph(graph, hidden)
        torch.cuda.synchronize(device)
        self._max_graph_size = largest
        logger.info("captured CUDA graphs for decode batch sizes %s", sizes)

    def _static_meta(self, size: int) -> AttentionMetadata:
        s = self._static
        meta = AttentionMetadata(
            slot_mapping=s["slot_mapping"][:size],
            query_start_loc=s["query_start_loc"][: size + 1],
            seq_lens=s["seq_lens"][:size],
            block_tables=s["block_tables"][:size],
            max_query_len=1,
            # The kernels size their loops from this; a graph must cover every length it replays.
            max_seq_len=self.max_model_len,
        )
        if self.windowed:
            meta.window_slot_mapping = s["window_slot_mapping"][:size]
            meta.window_block_tables = s["window_block_tables"][:size]
        return meta

    def _replay(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        n = input_ids.shape[0]
        size = min(s for s in self._graphs if s >= n)
        self.last_graph_batch = size
        s = self._static
        s["input_ids"][:n] = input_ids
        s["positions"][:n] = positions
        s["slot_mapping"].fill_(-1)
        s["slot_mapping"][:n] = meta.slot_mapping
        s["seq_lens"].fill_(1)
        s["seq_lens"][:n] = meta.seq_lens
        width = meta.block_tables.shape[1]
        s["block_tables"][:n, :width] = meta.block_tables
        if self.windowed:
            s["window_slot_mapping"].fill_(-1)
            s["window_slot_mapping"][:n] = meta.window_slot_mapping
            s["window_block_tables"][:n, :width] = meta.window_block_tables
        self._graphs[size].graph.replay()
        return self._graphs[size].hidden[:n]
