"""The executor: the one place that knows devices. It builds the model and its paged KV cache,
turns a scheduled batch into flat tensors, runs the model and samples.

A step's host arrays (and the sampler's) reach the device in one copy from pinned buffers reused
step after step (staging.py). With async scheduling a step is launched before the host has read
the tokens of the step before it: their input ids are gathered from that step's samples on the
device, so the host never waits between two launches.

On CUDA, decode-only steps replay CUDA graphs captured once per batch-size bucket (1, 2, 4, 8, then
every 8 up to 128 and every 16 beyond, up to max_num_seqs): the forward, the LM head and the
greedy argmax. The batch is padded to its bucket, padding tokens write to no slot (slot -1), and
the attention metadata lives in static buffers that each replay refills. With LoRA the graphs
also take each token's adapter slot from a static buffer, so a decode step of any adapters
replays them. With speculative decoding, short steps of batches small enough to speculate
(disable_by_batch_size) replay graphs too: one per batch-size bucket at 1 + K tokens a sequence,
for the target's verify steps and a draft model's catch-up steps (the tokens the target accepted).
A sequence with fewer tokens keeps them packed; the padding tokens come after every sequence's and
belong to none (attention computes nothing for them), so each query sits at its real position and
reads only its own sequence's keys.
An EAGLE head's runner captures the same graphs for its draft and catch-up steps; the hidden state
it takes per token and the one it gives sit in two static buffers, real tokens first: each replay
copies the step's in and hands back a view of the other.

A model with sliding-window layers shorter than the context keeps their KV in a pool of its own
(sizing.kv_pools; the block manager frees the blocks behind each window), so a step carries a
second block table and slot mapping for those layers; where every layer slides there is one pool,
the window one.

A hybrid model's recurrent layers (Mamba-2, gated DeltaNet, short convolutions) hold a state per
sequence instead of KV
(models/recurrent_state.py): their entries of `kv_caches` are RecurrentStates of max_num_seqs +
STATE_SLOTS_BEYOND_SEQS slots, which the block manager hands out (engine/state_block_manager.py)
but for the last, the padding's. Such a model runs eagerly: no CUDA graph is captured for it.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from pagoda_runtime.contract.config import KV_CACHE_DTYPES, EngineConfig, ModelConfig
from pagoda_runtime.contract.quantization_selection import cpu_packed_kernels, cpu_vocab_dtype
from pagoda_runtime.contract.sizing import (
    STATE_SLOTS_BEYOND_SEQS,
    KVPools,
    kv_bytes_per_block,
    kv_heads_per_rank,
    kv_layer_bytes_per_token,
    kv_pools,
)
from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.engine.stats import StepShape
from pagoda_runtime.executor import kv_scales
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.cpu_threads import configure_torch_threads
from pagoda_runtime.executor.devices import Placement, dtype_name, resolve_dtype
from pagoda_runtime.executor.kernels import get_attention_ops
from pagoda_runtime.executor.kernels.lora_slots import lora_batch
from pagoda_runtime.executor.kernels.reference import FP8_KV_DTYPE
from pagoda_runtime.executor.models import build_model
from pagoda_runtime.executor.models.lora_layers import LoraSlots, attach_lora
from pagoda_runtime.executor.models.recurrent_state import RecurrentState, allocate_state
from pagoda_runtime.executor.prompt_logprobs import DevicePromptLogprobs, PromptSpan, prompt_spans
from pagoda_runtime.executor.quantization.memory import decode_weight_bytes, model_weight_bytes
from pagoda_runtime.executor.rejection_sampler import Drafts
from pagoda_runtime.executor.sampler import DeviceSamples, Sampler, SamplerOutput, uses_history
from pagoda_runtime.executor.staging import Staging
from pagoda_runtime.parallel.lora_broadcast import AdapterWeights, LoraLoad
from pagoda_runtime.parallel.step_broadcast import DraftStepSender, StepInputs, StepSender
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
    """The decode batch sizes CUDA graphs are captured for: 1, 2, 4, 8, then every 8 up to 128 and
    every 16 beyond (a batch is padded up to the next; powers of two padded 129 sequences to 256),
    and max_num_seqs itself."""
    sizes = [1, 2, 4, 8, *range(16, 129, 8), *range(144, max_num_seqs + 1, 16)]
    sizes = [s for s in sizes if s <= max_num_seqs]
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


@dataclass
class LaunchedStep:
    """One step on its way: its forward queued, and its sampling unless `ModelRunner.sample` is
    still to queue it (async scheduling, a batch whose sampling reads the previous step's tokens)."""

    batch: ScheduledBatch
    shape: StepShape
    # Indices into batch.seqs of the sequences that sample this step, one per logits row: a
    # sequence verifying a draft has a row per drafted position and one after them.
    rows: list[int]
    # How many output tokens each sampling row's sequence had before this row's: what min_tokens
    # and a seeded sample's noise count.
    output_index: list[int]
    drafts: Drafts | None = None  # of a step that verifies drafts (speculative decoding)
    logits: torch.Tensor | None = None  # of the sampling rows; None on every rank but 0
    greedy: torch.Tensor | None = None  # their argmax, when a CUDA graph computed it
    sampler_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    samples: DeviceSamples | None = None  # None until sampled, when no row samples, on ranks > 0
    # Of a step that computes prompt positions whose logprobs a request asked for (rank 0's).
    prompt_spans: list[PromptSpan] = field(default_factory=list)
    prompt_targets: torch.Tensor | None = None
    prompt_logprobs: DevicePromptLogprobs | None = None

    @property
    def sampled(self) -> bool:
        return self.samples is not None or self.logits is None

    def wait(self) -> SamplerOutput:
        """The samples, once the device has computed them and copied them back."""
        return SamplerOutput([], []) if self.samples is None else self.samples.to_host()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [size, vocab] float32
    greedy: torch.Tensor  # [size] int64: the argmax of each row
    hidden: torch.Tensor | None = None  # the hidden states an EAGLE head reads, [tokens, width]


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
        kv_share: float = 1.0,
        reserve_bytes: int = 0,
        build: Callable[..., nn.Module] = build_model,
        hidden_layers: tuple[int, ...] = (),
        token_state_width: int = 0,
    ) -> None:
        """quantization: the method the projections are built with (already checked against the
        checkpoint by quantization_selection.py); tp: this process's rank; kv_share: the part of the
        KV budget this cache takes; reserve_bytes: device memory taken after this cache is sized,
        left out of a budget measured from the GPU's memory (a draft model's weights and cache take
        both, engine/build.py); build: what builds the model from build_model's arguments (an EAGLE
        head's, models/eagle_head.py); hidden_layers: the layers whose entering hidden states each
        step hands over (hand_hidden_states; the number of layers stands for the final norm's
        output), known before the CUDA graphs are captured so that they keep them too;
        token_state_width: the width of the hidden state a model takes per token beside its id, in
        `model.inputs`, and gives per token in `model.outputs` (an EAGLE head's), 0 for a model
        without: the CUDA graphs read and write them in static buffers."""
        self.kv_share = kv_share
        self.reserve_bytes = reserve_bytes
        self.config = model_config
        self.tp = tp
        # This rank's KV cache holds only the KV heads its query heads read.
        self.kv_shape = model_config.architecture.kv_cache_shape
        self.num_kv_heads = kv_heads_per_rank(self.kv_shape.heads, tp.size)
        self.device = placement.device
        self.dtype = placement.dtype
        if self.device.type == "cpu":
            logger.info("CPU path: %d torch threads", configure_torch_threads())
        self.kv_cache_dtype = resolve_kv_cache_dtype(engine_config.kv_cache_dtype, self.dtype, self.device)
        self.block_size = engine_config.block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // self.block_size)
        self.model = build(
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
        if self.device.type == "cuda":
            self.model.pack_for_gpu()
        self.model.eval()
        # The LoRA adapters' device slots (filled by engine/lora_manager.py) come before the KV
        # cache, which gets what they leave.
        self.lora_slots: LoraSlots | None = None
        if engine_config.enable_lora:
            self.lora_slots = attach_lora(
                self.model, engine_config.max_loras, engine_config.max_lora_rank, self.dtype
            )
        arch = model_config.architecture
        if self.kv_cache_dtype == FP8_KV_DTYPE and arch.num_state_layers:
            raise ValueError(
                "an fp8 KV cache is not served for hybrid models with recurrent layers (Mamba-2, gated "
                "DeltaNet, short convolutions); use --kv-cache-dtype auto"
            )
        if self.kv_cache_dtype == FP8_KV_DTYPE:
            scales = kv_scales.calibrate(
                self.model,
                model_config.architecture.vocab_size,
                max_model_len,
                self.block_size,
                self.kv_shape.planes,
                self.num_kv_heads,
                self.kv_shape.head_dim,
                self.dtype,
                self.device,
            )
            for layer, layer_scales in zip(self.model.layers, scales, strict=True):
                layer.self_attn.kv_scales = layer_scales
        self.weight_bytes = model_weight_bytes(self.model)
        self.decode_weight_bytes = decode_weight_bytes(self.model)  # what one decode step reads
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
        # The state slots the block manager hands out (0: no layer keeps a state); the one after them
        # is the padding sequences'.
        self.state_slots = (
            engine_config.max_num_seqs + STATE_SLOTS_BEYOND_SEQS - 1 if arch.num_state_layers else 0
        )
        rank_arch = arch.per_rank(tp.size)  # a rank keeps the states of its heads
        # A layer that neither attends nor keeps a state (Nemotron-H's MLP layers) holds nothing.
        self.kv_caches: list[torch.Tensor | RecurrentState | None] = [
            allocate_state(rank_arch, layer, self.state_slots + 1, self.device, self.kv_cache_dtype)
            if arch.is_state_layer(layer)
            else None
            if not arch.is_attention_layer(layer)
            else torch.empty(
                self.kv_shape.planes,
                self._layer_blocks(layer),
                self.block_size,
                self.num_kv_heads,
                self.kv_shape.head_dim,
                device=self.device,
                dtype=self.kv_cache_dtype,
            )
            for layer in range(arch.num_hidden_layers)
        ]
        self.sampler = Sampler(
            self.device, model_config.architecture.vocab_size, model_config.eos_token_ids, engine_config.seed
        )
        self._staging = Staging(self.device)
        self._graphs: dict[tuple[int, int], _Graph] = {}  # (batch size, tokens a sequence) -> its graph
        self._graph_sizes: list[int] = []  # decode's
        self._graph_pool = None
        self._max_graph_size = 0
        # Short steps' graphs (speculative decoding's verify and catch-up steps): their batch sizes
        # and their tokens a sequence (1 + K); none without speculative decoding.
        self._short_sizes: list[int] = []
        self._short_width = 0
        self.last_prepare_s = 0.0  # host time spent building the last step's tensors
        # The CUDA graph bucket the last forward replayed, None when it ran eagerly (profiles read it).
        self.last_graph_batch: int | None = None
        # Rank 0 of a tensor-parallel group: where each step goes to the other ranks first.
        self.step_sender: StepSender | DraftStepSender | None = None
        # With an EAGLE proposer: what takes each launched step's hidden states (hand_hidden_states).
        self._hidden_sink: Callable[[ScheduledBatch, torch.Tensor], None] | None = None
        self._hidden: dict[int, torch.Tensor] = {}  # layer -> the hidden state entering it, this step
        self._hidden_layers = hidden_layers
        self._replayed_hidden: torch.Tensor | None = None  # the last replay's, in its graph's buffer
        self._token_state_width = token_state_width
        # The graphs' per-token hidden states in and out (an EAGLE head's), real tokens first.
        self._token_states: tuple[torch.Tensor, torch.Tensor] | None = None
        self._keep_hidden_states()
        if self.device.type == "cuda" and not engine_config.enforce_eager and not self.state_slots:
            self._capture_graphs(engine_config.max_num_seqs, engine_config.speculative_config)

    def load_lora(self, slot: int, weights: list, scaling: float, whole: AdapterWeights | None) -> None:
        """Put an adapter in device slot `slot` on every rank: `weights`, this rank's slot tensors
        (LoraSlots.slot_weights), here; `whole`, the adapter as read, to the other ranks first."""
        if self.step_sender is not None:
            self.step_sender.send_lora(LoraLoad(slot, scaling, whole))
        self.lora_slots.load_slot(slot, weights, scaling)

    def receive_lora(self, load: LoraLoad) -> None:
        """The other ranks: rank 0's adapter, cut to this rank's shard, into the same slot."""
        slots = self.lora_slots
        if slots is None:
            raise RuntimeError("rank 0 sent a LoRA adapter, but this rank runs without --enable-lora")
        slots.load_slot(load.slot, slots.slot_weights(f"in slot {load.slot}", load.weights), load.scaling)

    def hand_hidden_states(self, sink: Callable[[ScheduledBatch, torch.Tensor], None]) -> None:
        """After each launched step, give `sink` the step's batch and, for each token it ran, the
        hidden states entering the runner's hidden_layers concatenated in that order ([tokens,
        len(layers) * hidden]): what an EAGLE head drafts from. A replayed step's are views of its
        graph's buffer, which the next replay overwrites: `sink` copies what it keeps."""
        self._hidden_sink = sink

    def _keep_hidden_states(self) -> None:
        """Hooks that keep the hidden state entering each of hidden_layers while the model runs
        (eagerly, or while a CUDA graph is captured: the graph then computes them on each replay)."""
        num_layers = len(self.model.layers)

        def keep(layer: int, module: nn.Module, args: tuple) -> None:
            x, residual = args[1], args[2]
            self._hidden[layer] = x if residual is None else x + residual

        for layer in sorted(set(self._hidden_layers) - {num_layers}):
            self.model.layers[layer].register_forward_pre_hook(partial(keep, layer))

    def _gathered_hidden(self, out: torch.Tensor | None = None) -> torch.Tensor:
        hidden, self._hidden = self._hidden, {}
        return torch.cat([hidden[layer] for layer in self._hidden_layers], dim=-1, out=out)

    def _hand_hidden(self, batch: ScheduledBatch) -> None:
        if self.last_graph_batch is None:
            hidden = self._gathered_hidden()
        else:  # the real tokens come first in a replayed step, the padding after them
            hidden = self._replayed_hidden[: sum(batch.num_new_tokens)]
        self._hidden_sink(batch, hidden)

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
        """What the KV caches of every layer (a Mamba layer's states) occupy on this rank."""
        return sum(
            cache.nbytes if isinstance(cache, RecurrentState) else cache.numel() * cache.element_size()
            for cache in self.kv_caches
            if cache is not None
        )

    @property
    def window(self) -> int | None:
        """The window (or attention chunk) whose layers keep only its blocks, None where none does."""
        return self.config.architecture.window if self.pools.window_blocks else None

    def _layer_blocks(self, layer: int) -> int:
        if self.pools.window_blocks and self.config.architecture.layer_window(layer) is not None:
            return self.pools.window_blocks
        return self.pools.full_blocks

    def _kv_pools(self, engine_config: EngineConfig) -> KVPools:
        rank_slice = self.config.architecture.per_rank(self.tp.size)
        budget = self._kv_budget(engine_config.kv_cache_memory, engine_config.gpu_memory_utilization)
        budget = int(budget * self.kv_share)
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
            budget = int(total * gpu_memory_utilization) - (total - free) - self.reserve_bytes
        elif kv_cache_memory > 1:
            budget = int(kv_cache_memory)
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int((free - self.reserve_bytes) * kv_cache_memory)
        else:
            budget = CPU_KV_CACHE_BYTES
        if budget < 1:
            raise ValueError(f"the KV cache budget is {budget} bytes; raise {flag}")
        return budget

    # ---- one step ----------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, in_flight: LaunchedStep | None = None) -> LaunchedStep:
        """Queue one step: its forward and its sampling. On CUDA this returns while the device
        still computes; LaunchedStep.wait reads the samples.

        `in_flight`: the step launched before this one, whose tokens the host has not read yet
        (async scheduling). The input ids of those tokens are gathered from its samples on the
        device, and a batch whose sampling reads its sequences' previous tokens (penalties, a
        grammar) is left unsampled: the engine calls `sample` once it has read `in_flight`.

        With tensor parallelism every rank runs every step on the same batch (the forward and the
        logits are collectives); only rank 0 samples, the others get no samples."""
        started = time.perf_counter()
        step, launched = self._prepare(batch, in_flight, prompt_logprobs=True)
        self.last_prepare_s = time.perf_counter() - started
        logits, greedy = self.run(step)
        if self._hidden_sink is not None:
            self._hand_hidden(batch)
        if launched.prompt_spans and self.tp.is_driver:
            sampling = len(launched.rows)
            launched.prompt_logprobs = DevicePromptLogprobs(
                launched.prompt_spans, logits[sampling:], launched.prompt_targets
            )
            logits = logits[:sampling] if sampling else None
        if logits is None or not self.tp.is_driver:
            launched.rows, launched.output_index = [], []
            return launched
        launched.logits, launched.greedy = logits, greedy
        if in_flight is None or not any(uses_history(batch.seqs[i]) for i in launched.rows):
            self.sample(launched)
        return launched

    @torch.inference_mode()
    def sample(self, launched: LaunchedStep) -> None:
        """Queue the sampling of a launched step's rows."""
        seqs = [launched.batch.seqs[i] for i in launched.rows]
        launched.samples = self.sampler(
            launched.logits,
            seqs,
            launched.output_index,
            launched.sampler_inputs,
            launched.greedy,
            launched.drafts,
        )

    @torch.inference_mode()
    def forward_logits(self, batch: ScheduledBatch) -> torch.Tensor | None:
        """The forward of `batch` and the float32 logits of its sequences that sample, unsampled
        (None when none samples): a draft model's proposer draws from them itself."""
        step, _ = self._prepare(batch, None)
        return self.run(step)[0]

    @torch.inference_mode()
    def score(self, seq: Sequence) -> torch.Tensor:
        """Float32 logits [num_tokens, vocab] after each token of `seq`, in one prefill; `seq` holds
        blocks for all its tokens and none of them is computed yet."""
        step, _ = self._prepare(ScheduledBatch([seq], [seq.num_tokens]), None, every_logit=True)
        return self.run(step)[0]

    @torch.inference_mode()
    def run(self, step: StepInputs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The forward, the float32 logits of step.logits_rows (None when there are none) and, from
        a CUDA graph, their argmax: what every rank of a group computes for a step. Rank 0 first
        sends the step to the others."""
        if self.step_sender is None:
            return self._forward(step)
        with self.step_sender.sending(step):
            return self._forward(step)

    def _forward(self, step: StepInputs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if step.token_states is not None:  # rank 0's own, or received from it
            self.model.inputs = step.token_states
        if step.replayable:
            return self._replay(step)
        self.last_graph_batch = None
        if step.lora_slots is None:
            hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta)
        else:
            slots = self.lora_slots
            slots.batch = lora_batch(step.lora_slots, slots.num_slots)
            try:
                hidden = self.model(step.input_ids, step.positions, self.kv_caches, step.meta)
            finally:
                slots.batch = None
        if self._hidden_layers:
            self._hidden[len(self.model.layers)] = hidden
        if step.logits_rows.shape[0] == 0:
            return None, None
        return self.model.compute_logits(hidden[step.logits_rows]), None

    def _prepare(
        self,
        batch: ScheduledBatch,
        in_flight: LaunchedStep | None,
        every_logit: bool = False,
        prompt_logprobs: bool = False,
    ) -> tuple[StepInputs, LaunchedStep]:
        """The step's flat tensors, built with numpy and copied to the device in one transfer
        together with the sampler's inputs; logits for the last token of each sequence that
        samples, or for every token (`every_logit`, scoring), and with `prompt_logprobs` (a
        target model's step, not a draft's) those of the prompt positions requests asked for. A
        decode step every sequence of which samples is padded up to a captured graph's batch size
        (padding tokens write to slot -1), and replays it; so is a short step (a verify step, a
        draft's catch-up) whose sequences all sample and fit a short-step graph."""
        seqs = batch.seqs
        n = len(seqs)
        bs = self.block_size
        news = np.array(batch.num_new_tokens, dtype=np.int64)
        starts = np.array([seq.num_computed_tokens for seq in seqs], dtype=np.int64)
        known = np.array([len(seq.token_ids) for seq in seqs], dtype=np.int64)
        pending = np.array([seq.num_pending for seq in seqs], dtype=np.int64)
        drafted = np.zeros(n, dtype=np.int64)  # draft tokens each sequence verifies
        for i, draft in batch.drafts.items():
            drafted[i] = len(draft)
        ends = starts + news
        rows = np.flatnonzero(ends == known + pending + drafted)
        spans, prompt_rows, prompt_targets = (
            prompt_spans(seqs, starts, news, known) if prompt_logprobs else ([], None, None)
        )
        num_tokens = int(news.sum())
        decode = num_tokens == n
        seq_slots = None if batch.lora_slots is None else np.array(batch.lora_slots, dtype=np.int32)
        graph = None
        per_seq = 1  # tokens a sequence in the graph replayed
        samples_all = not every_logit and rows.shape[0] == n and not spans
        if decode and samples_all and n <= self._max_graph_size:
            graph = self._graph_sizes[bisect.bisect_left(self._graph_sizes, n)]
        elif (
            not decode
            and samples_all
            and self._short_sizes
            and n <= self._short_sizes[-1]
            and int(news.max()) <= self._short_width
        ):
            graph = self._short_sizes[bisect.bisect_left(self._short_sizes, n)]
            per_seq = self._short_width
        size = graph or n  # sequences, padding included
        padded_tokens = size * per_seq if graph else num_tokens

        query_start = np.arange(size + 1, dtype=np.int32)
        input_ids = np.zeros(padded_tokens, dtype=np.int64)
        if decode:
            positions = np.zeros(size, dtype=np.int64)
            positions[:n] = starts
            have = np.flatnonzero(starts < known)
            input_ids[have] = [
                seqs[i].token_ids[p] for i, p in zip(have.tolist(), starts[have].tolist(), strict=True)
            ]
        else:
            np.cumsum(news, out=query_start[1 : n + 1])
            query_start[n + 1 :] = num_tokens  # padding sequences of a short-step graph: no tokens
            positions = np.zeros(padded_tokens, dtype=np.int64)
            positions[:num_tokens] = np.repeat(starts - query_start[:n], news) + np.arange(num_tokens)
            firsts = query_start[:n].tolist()
            for i, (seq, first, start, end) in enumerate(
                zip(seqs, firsts, starts.tolist(), ends.tolist(), strict=True)
            ):
                known_part = seq.token_ids[start:end]  # short of a last token still on the device
                input_ids[first : first + len(known_part)] = known_part
                if i in batch.drafts:
                    input_ids[first + len(known_part) : first + news[i]] = batch.drafts[i]
        block_tables = [seq.block_table for seq in seqs]
        window_tables = [seq.window_block_table for seq in seqs] if self.windowed else []
        width = max(map(len, block_tables + window_tables))
        token_rows = np.arange(n) if decode else np.repeat(np.arange(n), news)
        real = positions[:num_tokens]
        tables, slots = _tables_and_slots(block_tables, size, width, token_rows, real, bs, padded_tokens)
        seq_lens = np.ones(size, dtype=np.int32)
        seq_lens[:n] = ends
        # A verifying sequence's logits rows: its last known token's and each draft token's.
        widths = drafted[rows] + 1
        row_seqs = np.repeat(rows, widths)
        row_offsets = np.arange(row_seqs.shape[0]) - np.repeat(np.cumsum(widths) - widths, widths)
        logits_rows = (
            np.arange(num_tokens)
            if every_logit
            else np.repeat(query_start[1:][rows].astype(np.int64) - widths, widths) + row_offsets
        )
        if spans:  # after the sampling rows (prompt_logprobs.py)
            logits_rows = np.concatenate([logits_rows, prompt_rows])
        # A sequence whose last input token was sampled by the step in flight.
        waiting = np.flatnonzero(ends > known + drafted)
        gather_to = (query_start[waiting] + known[waiting] - starts[waiting]).astype(np.int64)
        gather_from = self._rows_in(in_flight, [seqs[i] for i in waiting.tolist()])
        sampling = [seqs[i] for i in row_seqs.tolist()]
        output_index = (
            ends[row_seqs]
            - drafted[row_seqs]
            - np.array([seq.num_prompt_tokens for seq in sampling], dtype=np.int64)
            + row_offsets
        ).tolist()
        arrays = {
            "input_ids": input_ids,
            "positions": positions,
            "slot_mapping": slots,
            "query_start_loc": query_start,
            "seq_lens": seq_lens,
            "block_tables": tables,
            "logits_rows": logits_rows,
            "gather_to": gather_to,
            "gather_from": gather_from,
        }
        if seq_slots is not None:
            arrays["lora_slots"] = np.full(padded_tokens, -1, dtype=np.int32)
            arrays["lora_slots"][:num_tokens] = seq_slots[token_rows]
        if self.windowed:
            arrays["window_block_tables"], arrays["window_slot_mapping"] = _tables_and_slots(
                window_tables, size, width, token_rows, real, bs, padded_tokens
            )
        if self.state_slots:
            arrays["state_slots"] = np.full(size, self.state_slots, dtype=np.int64)
            arrays["state_slots"][:n] = [seq.state_slot for seq in seqs]
            arrays["state_fresh"] = np.zeros(size, dtype=np.bool_)
            arrays["state_fresh"][:n] = starts == 0
        if not every_logit:
            arrays |= {f"sampler.{k}": v for k, v in self.sampler.host_arrays(sampling, output_index).items()}
        if spans:
            arrays["prompt_targets"] = prompt_targets
        staged = self._staging.to_device(arrays)
        if waiting.shape[0]:
            sampled = in_flight.samples.tokens
            staged["input_ids"].index_copy_(
                0, staged["gather_to"], sampled.index_select(0, staged["gather_from"])
            )
        meta = AttentionMetadata(
            slot_mapping=staged["slot_mapping"],
            query_start_loc=staged["query_start_loc"],
            seq_lens=staged["seq_lens"],
            block_tables=staged["block_tables"],
            # A short-step graph's: the tiles its attention was captured with.
            max_query_len=per_seq if graph else int(news.max()),
            max_seq_len=int(ends.max()),
        )
        if self.windowed:
            meta.window_block_tables = staged["window_block_tables"]
            meta.window_slot_mapping = staged["window_slot_mapping"]
        if self.state_slots:
            meta.state_slots, meta.state_fresh = staged["state_slots"], staged["state_fresh"]
        step = StepInputs(
            staged["input_ids"],
            staged["positions"],
            meta,
            staged["logits_rows"],
            replayable=graph is not None,
            lora_slots=staged.get("lora_slots"),
            # Set by the proposer before this forward; sent with the step to the other ranks.
            token_states=self.model.inputs if self._token_state_width else None,
        )
        sampler_inputs = {
            k.removeprefix("sampler."): v for k, v in staged.items() if k.startswith("sampler.")
        }
        shape = StepShape.of(starts, news, row_seqs.shape[0])
        drafts = None
        if batch.drafts:
            verifying = rows.tolist()
            probs = [batch.draft_probs.get(i) for i in verifying] if batch.draft_probs else None
            drafts = Drafts([batch.drafts.get(i, []) for i in verifying], probs)
        launched = LaunchedStep(
            batch, shape, row_seqs.tolist(), output_index, drafts, sampler_inputs=sampler_inputs
        )
        if spans:
            launched.prompt_spans, launched.prompt_targets = spans, staged["prompt_targets"]
        return step, launched

    @staticmethod
    def _rows_in(in_flight: LaunchedStep | None, seqs: list[Sequence]) -> np.ndarray:
        """Where each of `seqs` (sequences whose last token the in-flight step sampled) is in its
        samples."""
        if not seqs:
            return np.zeros(0, dtype=np.int64)
        sampled = [in_flight.batch.seqs[i] for i in in_flight.rows]
        if sampled == seqs:  # a decode batch in the same order as the last: the common case
            return np.arange(len(seqs), dtype=np.int64)
        row_of = {seq.seq_id: k for k, seq in enumerate(sampled)}
        return np.array([row_of[seq.seq_id] for seq in seqs], dtype=np.int64)

    def _tables(self, tables: list[list[int]], width: int) -> torch.Tensor:
        flat: list[int] = []
        for table in tables:
            flat += table
            flat += [0] * (width - len(table))
        return self._tensor(flat, torch.int32).view(len(tables), width)

    # ---- CUDA graphs -------------------------------------------------------------------------

    def _capture_graphs(self, max_num_seqs: int, speculative: SpeculativeConfig | None) -> None:
        """One graph per decode batch size, and with speculative decoding one per short-step batch
        size: the forward, the LM head and each row's argmax, so a greedy decode step launches nothing
        else. Their outputs are written into buffers shared by every graph (the LM head's float32
        logits would otherwise take [tokens, vocab] per graph)."""
        sizes = graph_batch_sizes(max_num_seqs)
        shapes = [(size, 1) for size in sizes]
        if speculative is not None:
            self._short_width = 1 + speculative.num_speculative_tokens
            self._short_sizes = graph_batch_sizes(min(max_num_seqs, speculative.disable_by_batch_size))
            shapes += [(size, self._short_width) for size in self._short_sizes]
        largest = sizes[-1]
        tokens = max(size * width for size, width in shapes)
        device = self.device
        self._static = {
            "input_ids": torch.zeros(tokens, dtype=torch.int64, device=device),
            "positions": torch.zeros(tokens, dtype=torch.int64, device=device),
            "slot_mapping": torch.full((tokens,), -1, dtype=torch.int64, device=device),
            "query_start_loc": torch.arange(largest + 1, dtype=torch.int32, device=device),
            # A short step's packed sequences, refilled by each replay (decode's never change).
            "short_query_start_loc": torch.zeros(largest + 1, dtype=torch.int32, device=device),
            "seq_lens": torch.ones(largest, dtype=torch.int32, device=device),
            "block_tables": torch.zeros(largest, self.max_blocks_per_seq, dtype=torch.int32, device=device),
        }
        if self.windowed:
            self._static["window_slot_mapping"] = torch.full((tokens,), -1, dtype=torch.int64, device=device)
            self._static["window_block_tables"] = torch.zeros_like(self._static["block_tables"])
        lora = self.lora_slots
        if lora is not None:
            # Each token's adapter slot, -1 for the base model's and the padding: the graphs take
            # the adapters' deltas whatever the batch's adapters (kernels/triton_lora.py).
            self._static["lora_slots"] = torch.full((tokens,), -1, dtype=torch.int32, device=device)
        logits = torch.empty(tokens, self.config.architecture.vocab_size, dtype=torch.float32, device=device)
        greedy = torch.empty(tokens, dtype=torch.int64, device=device)
        # With an EAGLE head: the hidden states it reads, written by every graph.
        hidden_width = len(self._hidden_layers) * self.config.architecture.hidden_size
        hidden_states = (
            torch.empty(tokens, hidden_width, dtype=self.dtype, device=device) if hidden_width else None
        )
        if self._token_state_width:
            # Zeros, so that the padding rows a graph computes never start from NaNs.
            state_shape = (tokens, self._token_state_width)
            self._token_states = (
                torch.zeros(state_shape, dtype=self.dtype, device=device),
                torch.zeros(state_shape, dtype=self.dtype, device=device),
            )
        token_states = self._token_states
        # Most tokens first, so that the smaller graphs fit in the memory pool the largest reserved.
        for size, width in sorted(shapes, key=lambda shape: shape[0] * shape[1], reverse=True):
            count = size * width
            meta = self._static_meta(size, width)
            if width > 1:
                # What the capture runs on: every sequence `width` tokens over as many keys.
                meta.query_start_loc.copy_(torch.arange(0, count + 1, width, dtype=torch.int32))
                meta.seq_lens.fill_(width)
            static = self._static
            args = (static["input_ids"][:count], static["positions"][:count], self.kv_caches, meta)

            def forward(args=args, count=count) -> None:
                if token_states is not None:
                    self.model.inputs = token_states[0][:count]
                if lora is not None:
                    lora.batch = lora_batch(self._static["lora_slots"][:count], lora.num_slots)
                try:
                    hidden = self.model(*args)
                finally:
                    if lora is not None:
                        lora.batch = None
                rows = self.model.compute_logits(hidden, out=logits[:count])
                torch.argmax(rows, dim=-1, out=greedy[:count])
                if token_states is not None:
                    token_states[1][:count].copy_(self.model.outputs)
                if hidden_states is not None:
                    self._hidden[len(self.model.layers)] = hidden
                    self._gathered_hidden(out=hidden_states[:count])

            graph = self._record(forward)
            kept = None if hidden_states is None else hidden_states[:count]
            self._graphs[size, width] = _Graph(graph, logits[:count], greedy[:count], kept)
            meta.seq_lens.fill_(1)
        self._graph_sizes = sizes
        self._max_graph_size = largest
        logger.info(
            "captured CUDA graphs for decode batch sizes %s and short-step batch sizes %s",
            sizes,
            self._short_sizes or "none",
        )

    def _record(self, forward: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """`forward` captured in a CUDA graph in the runner's memory pool, after a warm-up run
        (Triton compiles outside the capture)."""
        forward()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            forward()
        if self._graph_pool is None:
            self._graph_pool = graph.pool()
        torch.cuda.synchronize(self.device)
        return graph

    def _static_meta(self, size: int, width: int) -> AttentionMetadata:
        s = self._static
        query_start = s["query_start_loc"] if width == 1 else s["short_query_start_loc"]
        meta = AttentionMetadata(
            slot_mapping=s["slot_mapping"][: size * width],
            query_start_loc=query_start[: size + 1],
            seq_lens=s["seq_lens"][:size],
            block_tables=s["block_tables"][:size],
            max_query_len=width,
            # The kernels size their loops from this; a graph must cover every length it replays.
            max_seq_len=self.max_model_len,
        )
        if self.windowed:
            meta.window_slot_mapping = s["window_slot_mapping"][: size * width]
            meta.window_block_tables = s["window_block_tables"][:size]
        return meta

    def _replay(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph of the step's (padded) batch size and tokens a sequence; the logits and
        argmax of its rows that sample. A decode step's are views of the graphs' output buffers
        that the next replay overwrites (the device reads them before: it runs the step's sampling
        first)."""
        meta = step.meta
        size, width = meta.num_seqs, meta.max_query_len
        tokens = step.input_ids.shape[0]
        self.last_graph_batch = size
        s = self._static
        s["input_ids"][:tokens].copy_(step.input_ids)
        s["positions"][:tokens].copy_(step.positions)
        s["slot_mapping"][:tokens].copy_(meta.slot_mapping)
        s["seq_lens"][:size].copy_(meta.seq_lens)
        s["block_tables"][:size, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        if width > 1:
            s["short_query_start_loc"][: size + 1].copy_(meta.query_start_loc)
        if self.windowed:
            s["window_slot_mapping"][:tokens].copy_(meta.window_slot_mapping)
            table_width = meta.window_block_tables.shape[1]
            s["window_block_tables"][:size, :table_width].copy_(meta.window_block_tables)
        if "lora_slots" in s:
            if step.lora_slots is None:
                s["lora_slots"][:tokens].fill_(-1)
            else:
                s["lora_slots"][:tokens].copy_(step.lora_slots)
        states = self._token_states
        if states is not None:  # the model's given states, one per real token
            given = self.model.inputs
            states[0][: given.shape[0]].copy_(given)
        graph = self._graphs[size, width]
        graph.graph.replay()
        self._replayed_hidden = graph.hidden
        if states is not None:  # a view the next replay overwrites
            self.model.outputs = states[1][: given.shape[0]]
        if width > 1:
            return graph.logits[step.logits_rows], graph.greedy[step.logits_rows]
        rows = step.logits_rows.shape[0]
        return graph.logits[:rows], graph.greedy[:rows]


def _tables_and_slots(
    block_tables: list[list[int]],
    size: int,
    width: int,
    token_rows: np.ndarray,
    positions: np.ndarray,
    block_size: int,
    padded_tokens: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The block tables as one [size, width] array (zeros past each table and for padding rows),
    and each token's cache slot (-1 for padding tokens)."""
    lengths = np.fromiter(map(len, block_tables), np.int64, len(block_tables))
    tables = np.zeros((size, width), dtype=np.int32)
    tables[: len(block_tables)][np.arange(width) < lengths[:, None]] = np.fromiter(
        itertools.chain.from_iterable(block_tables), np.int32, int(lengths.sum())
    )
    slots = np.full(padded_tokens, -1, dtype=np.int64)
    pages = tables[token_rows, positions // block_size].astype(np.int64)
    slots[: positions.shape[0]] = pages * block_size + positions % block_size
    return tables, slots
