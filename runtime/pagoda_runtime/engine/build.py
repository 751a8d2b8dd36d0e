"""Everything the engine loop needs, built once from an EngineConfig.

The checkpoint is loaded (or, with load_format dummy, random weights of the shape it names are
drawn; or a model already in memory is taken), the quantization it is served with is chosen
(quantization_selection.py), the model runner sizes the KV cache from what is left, and the
context length is capped to what that cache holds. The memory report compares the
weights as loaded with sizing.py's prediction.

A speculative-decoding draft model is sharded over the target's tensor-parallel ranks (vLLM's
default, draft_tensor_parallel_size equal to the target's): each rank holds its slice of the
draft's weights and of its KV heads, so memory stays even across the GPUs and the fit gate
(sizing.fits) counts one slice per GPU. Rank 0 drives the draft as it drives the target, and the
other ranks replay the draft's forwards (parallel/step_broadcast.py's DRAFT_STEP). Whole on rank 0
alone, the draft would have needed no broadcast, but rank 0 would hold the whole draft while the
other GPUs sat idle through each draft forward, and a draft larger than one GPU's spare memory
could not run at all. An EAGLE head (one layer) is whole on every rank instead, and its steps are
replayed the same way, each with the hidden states it takes per token. A checkpoint's
multi-token-prediction layer (the mtp method) is drafted with as an EAGLE head is, but split over the
ranks like the target's layers (its experts are as large as theirs) and held in their quantization.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from torch import nn

from pagoda_runtime.contract.config import EngineConfig, ModelConfig
from pagoda_runtime.contract.lora_modules import parse_lora_module
from pagoda_runtime.contract.pooling import PoolerConfig
from pagoda_runtime.contract.quantization_selection import cpu_vocab_dtype, select_quantization
from pagoda_runtime.contract.sizing import (
    ModelArchitecture,
    check_tensor_parallel,
    kv_bytes_per_block,
    mtp_draft,
    weight_bytes,
)
from pagoda_runtime.contract.speculative import HEAD_METHODS, MTP, SpeculativeConfigError
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.draft_model_proposer import DraftModelProposer, check_same_vocabulary
from pagoda_runtime.engine.eagle_proposer import EagleProposer
from pagoda_runtime.engine.lora_manager import LoraManager
from pagoda_runtime.engine.memory_report import MemoryReport
from pagoda_runtime.engine.ngram_proposer import NgramProposer
from pagoda_runtime.engine.pooler import Pooler
from pagoda_runtime.engine.scheduler import Proposer, Scheduler
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.engine.window_block_manager import make_block_manager
from pagoda_runtime.executor.devices import Placement, resolve_placement
from pagoda_runtime.executor.model_runner import ModelRunner
from pagoda_runtime.executor.models import CausalLM, weight_shapes
from pagoda_runtime.executor.models.decoder import Weight
from pagoda_runtime.executor.models.eagle_head import EagleHead, read_head
from pagoda_runtime.executor.models.mtp_head import mtp_config, mtp_head, mtp_weight_shapes
from pagoda_runtime.loading.classifier_head import classifier_head
from pagoda_runtime.loading.load_progress import LOAD_PROGRESS
from pagoda_runtime.loading.lora_source import adapter_folder
from pagoda_runtime.loading.model_source import LoadedModel, ModelLoadError, load_model_source, load_mtp_layer
from pagoda_runtime.loading.random_model import random_model, random_weights
from pagoda_runtime.loading.sentence_transformers import PoolingConfigError, read_pooling
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineParts:
    engine_config: EngineConfig
    placement: Placement
    quantization: str  # the method the projections are held in (never "auto")
    model_config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner
    block_manager: BlockManager
    scheduler: Scheduler
    max_model_len: int  # the model's limit or --max-model-len, capped to what the KV cache holds
    memory: MemoryReport
    loras: LoraManager | None  # with --enable-lora
    draft_runner: ModelRunner | None  # a draft model's (speculative decoding), on this rank's slice
    sampling_defaults: dict[str, float]  # the model's recommended sampling (LoadedModel's)
    pooler: Pooler | None  # under --runner pooling, on rank 0: what makes the embeddings


def build_engine(
    engine_config: EngineConfig,
    loaded: LoadedModel | None = None,
    tp: TensorParallel = SINGLE_PROCESS,
    layout: str = "1x1",
) -> EngineParts:
    """`loaded`: a model already in memory instead of `engine_config.model`; `tp`: this process's
    rank of engine_config.tensor_parallel_size. Every rank builds the same parts (its slice of the
    model, its KV heads' cache); only rank 0 samples."""
    _check_lora_settings(engine_config)
    if engine_config.max_num_batched_tokens < 1 or engine_config.max_num_seqs < 1:
        raise ValueError("--max-num-batched-tokens and --max-num-seqs must both be at least 1")
    if tp.size != engine_config.tensor_parallel_size:
        raise ValueError(
            f"this process is a rank of a tensor-parallel group of {tp.size}, but the engine is "
            f"configured for {engine_config.tensor_parallel_size}; start one process per rank"
        )
    placement = resolve_placement(engine_config.device, engine_config.dtype)
    loaded, quantization = _load(
        engine_config.model,
        engine_config.quantization,
        engine_config,
        placement,
        loaded,
        engine_config.hf_overrides,
    )
    if loaded.config.classifier is not None and not engine_config.pooling:
        raise ModelLoadError(
            f"{engine_config.model} is a sequence classifier (a reranker or reward model) and writes no "
            "text; serve it with --runner pooling"
        )
    # Before any weight is read: a model that does not split over the ranks fails in one sentence.
    arch = loaded.config.architecture
    sliced = check_tensor_parallel(arch, tp.size, quantization, loaded.group_size)
    if arch.num_state_layers and engine_config.speculative_config is not None:
        raise ValueError(
            "speculative decoding is not served for hybrid models with recurrent layers (Mamba-2, gated "
            "DeltaNet, short convolutions): their state cannot be rolled back past a rejected draft "
            "token; drop --speculative-config"
        )
    limit = engine_config.max_model_len or loaded.config.context_length
    draft = _load_draft(engine_config, placement, loaded, tp)
    head = _read_eagle_head(engine_config, loaded, placement) or _load_mtp_layer(
        engine_config, loaded, quantization, placement, tp
    )
    # A draft model's (or EAGLE head's) cache holds as many tokens as the target's: the KV budget
    # is split in proportion to their bytes per token; the draft's weights, read after the
    # target's cache is sized, are kept out of a budget measured from the GPU's memory.
    kv_share, reserve = 1.0, 0
    target_bytes = kv_bytes_per_block(sliced, engine_config.block_size)
    if draft is not None:
        kv_share = target_bytes / (target_bytes + kv_bytes_per_block(draft.sliced, engine_config.block_size))
        reserve = _predicted_weight_bytes(
            draft.loaded, draft.sliced, draft.quantization, engine_config, placement
        )
    if head is not None:
        head_block = kv_bytes_per_block(head.sliced, engine_config.block_size)
        kv_share = target_bytes / (target_bytes + head_block)
        reserve = head.predicted_weight_bytes
    weights = LOAD_PROGRESS.track(loaded.weights, len(weight_shapes(loaded.config)), arch.num_hidden_layers)
    runner = ModelRunner(
        loaded.config,
        weights,
        engine_config,
        placement,
        limit,
        quantization,
        tp,
        kv_share,
        reserve,
        # An EAGLE head (or MTP layer) reads these of every step, replayed ones included; the
        # pooler the final ones.
        hidden_layers=head.target_layers if head is not None else _pooled_layers(engine_config, arch),
    )
    pooler = None
    if engine_config.pooling and tp.is_driver:
        classifier = None
        if loaded.config.classifier is not None:
            classifier = classifier_head(loaded.config, loaded.folder, loaded.tokenizer, engine_config.seed)
        pooler = Pooler(_pooler_config(engine_config, loaded), classifier)
        runner.hand_hidden_states(pooler.record)
    loras = None
    # Rank 0 alone serves adapters; it sends each to the others as it puts it in a device slot.
    if runner.lora_slots is not None and tp.is_driver:
        max_cpu_loras = engine_config.max_cpu_loras or engine_config.max_loras
        loras = LoraManager(
            runner.lora_slots,
            loaded.config,
            engine_config.max_loras,
            max_cpu_loras,
            load=runner.load_lora,
            locate=partial(adapter_folder, download_dir=engine_config.download_dir),
        )
        for word in engine_config.lora_modules:
            module = parse_lora_module(word)
            loras.add(module.name, module.path, module.base_model_name)
    # Where every layer slides, a sequence holds only its window: the context is not bounded by the
    # cache, as long as one window fits (make_block_manager checks it).
    capacity = runner.pools.full_blocks * engine_config.block_size if runner.pools.full_blocks else limit
    max_model_len = _cap_context(limit, capacity, engine_config)
    block_manager = make_block_manager(
        runner.pools,
        engine_config.block_size,
        runner.window,
        engine_config.enable_prefix_caching,
        max_model_len,
        engine_config.max_num_batched_tokens,
        runner.state_slots,
    )
    if head is None:
        proposer, draft_runner, draft_memory = _proposer(
            engine_config, placement, draft, runner, max_model_len, tp
        )
    else:
        proposer, draft_runner, draft_memory = _head_proposer(
            engine_config, placement, head, runner, max_model_len
        )
    memory = _memory_report(
        engine_config.model, runner, loaded, quantization, sliced, engine_config, placement
    )
    if draft_memory is not None:
        memory = dataclasses.replace(memory, draft=draft_memory)
    logger.info("memory: %s", memory.describe())
    parts = EngineParts(
        engine_config=engine_config,
        placement=placement,
        quantization=quantization,
        model_config=loaded.config,
        tokenizer=loaded.tokenizer,
        runner=runner,
        block_manager=block_manager,
        scheduler=Scheduler(
            block_manager,
            engine_config.max_num_seqs,
            engine_config.max_num_batched_tokens,
            proposer=proposer,
            policy=engine_config.scheduling_policy,
            max_loras=engine_config.max_loras if engine_config.enable_lora else None,
        ),
        max_model_len=max_model_len,
        memory=memory,
        loras=loras,
        draft_runner=draft_runner,
        sampling_defaults=loaded.sampling_defaults,
        pooler=pooler,
    )
    if not tp.is_driver:
        return parts
    # One line with every effective setting, for whoever reads a pod's log first; `layout` is
    # world_layout.WorldLayout.describe(), nodes x ranks per node.
    logger.info(
        "pagoda-runtime settings: model=%s load_format=%s device=%s dtype=%s quantization=%s "
        "kv_cache_dtype=%s kv_blocks=%d (%d tokens) max_model_len=%d max_num_seqs=%d "
        "max_num_batched_tokens=%d block_size=%d prefix_caching=%s tensor_parallel_size=%d layout=%s "
        "pipeline_parallel_size=1",
        engine_config.model,
        engine_config.load_format,
        placement.device,
        placement.dtype_name,
        quantization,
        runner.kv_cache_dtype_name,
        runner.num_blocks,
        capacity,
        parts.max_model_len,
        engine_config.max_num_seqs,
        engine_config.max_num_batched_tokens,
        engine_config.block_size,
        block_manager.enable_prefix_caching,
        tp.size,
        layout,
    )
    return parts


def _pooled_layers(engine_config: EngineConfig, arch: ModelArchitecture) -> tuple[int, ...]:
    """Under --runner pooling, the final hidden states (after the last layer and its norm)."""
    return (arch.num_hidden_layers,) if engine_config.pooling else ()


def _pooler_config(engine_config: EngineConfig, loaded: LoadedModel) -> PoolerConfig:
    """--pooler-config's fields over the folder's sentence-transformers config, then the defaults; a
    classifier's head reads the last token's state as it is (transformers' and vLLM's way)."""
    override = engine_config.pooler_config or PoolerConfig()
    if loaded.config.classifier is not None:
        if override.normalize:
            raise ValueError(
                "--pooler-config's normalize applies to embeddings, and this model is a sequence classifier; "
                "drop it"
            )
        return PoolerConfig(override.pooling_type or "LAST", False)
    try:
        folder = read_pooling(loaded.folder) if loaded.folder is not None else None
    except PoolingConfigError:
        if override.pooling_type is None:
            raise
        folder = None
    config = override.over(folder)
    logger.info(
        "pooling: %s, %s", config.pooling_type, "normalized" if config.normalize else "not normalized"
    )
    return config


def _load(
    model: str,
    quantization_flag: str,
    engine_config: EngineConfig,
    placement: Placement,
    loaded: LoadedModel | None = None,
    hf_overrides: dict | None = None,
) -> tuple[LoadedModel, str]:
    """The model's weights (or random ones of its shape, with load_format dummy) and the method
    its projections are held in (quantization_selection.py); `hf_overrides` replace keys of its
    config.json."""
    if hf_overrides and (loaded is not None or engine_config.load_format == "dummy"):
        raise ModelLoadError(
            "--hf-overrides changes a checkpoint's config.json, and random weights have none; drop it "
            "or load a Hugging Face folder"
        )
    if loaded is None and engine_config.load_format == "dummy":
        LOAD_PROGRESS.phase(f"drawing random weights of the {model} shape")
        loaded = random_model(model, placement.device, placement.dtype, engine_config.seed)
    elif loaded is None:
        LOAD_PROGRESS.phase(f"reading the checkpoint {model}")
        loaded = load_model_source(model, placement.dtype, keep_quantized=True, hf_overrides=hf_overrides)
    quantization = select_quantization(
        quantization_flag,
        loaded.quantization,
        placement.device.type,
        model,
        engine_config.dtype,
        loaded.gguf_block,
    )
    if loaded.quantization is not None and quantization != loaded.quantization:
        if quantization_flag == "auto":
            logger.info(
                "%s stores %s blocks (%s); on the %s with --dtype %s auto dequantizes them at load "
                "(docs/architecture.md#quantization; --quantization %s keeps packed what has a layout)",
                model,
                loaded.quantization,
                loaded.gguf_block,
                placement.device.type,
                engine_config.dtype,
                loaded.quantization,
            )
        loaded = loaded.dequantized(placement.dtype)
    return loaded, quantization


@dataclass(frozen=True)
class _Draft:
    loaded: LoadedModel
    quantization: str
    sliced: ModelArchitecture  # the part of the draft each tensor-parallel rank holds


def _load_draft(
    engine_config: EngineConfig, placement: Placement, target: LoadedModel, tp: TensorParallel
) -> _Draft | None:
    """A draft model's weights and quantization, checked against the target's vocabulary and
    split over the target's ranks; None without one."""
    config = engine_config.speculative_config
    if config is None or config.method != "draft_model":
        return None
    draft, quantization = _load(config.model, "auto", engine_config, placement)
    check_same_vocabulary(target.config, target.tokenizer, draft.config, draft.tokenizer, config.model)
    try:
        sliced = check_tensor_parallel(draft.config.architecture, tp.size, quantization, draft.group_size)
    except ValueError as exc:
        raise SpeculativeConfigError(
            f"speculative_config.model {config.model!r} is split over the target's ranks, but {exc}; "
            'or use a draft model that splits, or {"method": "ngram"}'
        ) from exc
    return _Draft(draft, quantization, sliced)


@dataclass(frozen=True)
class _Head:
    """A draft head that reads the target's hidden states: an EAGLE head, whole on every rank and
    unquantized, or the checkpoint's MTP layer, split over the ranks in the target's quantization."""

    name: str  # for the memory report
    config: ModelConfig  # the head's, one layer
    weights: Iterable[tuple[str, Weight]]
    build: Callable[[CausalLM], Callable[..., nn.Module]]  # given the target, ModelRunner's build
    quantization: str
    tp: TensorParallel
    sliced: ModelArchitecture  # the part of the head's layer each rank holds
    target_layers: tuple[int, ...]  # the target layers whose input it reads (hidden_layers)
    predicted_weight_bytes: int  # this rank's


def _read_eagle_head(engine_config: EngineConfig, target: LoadedModel, placement: Placement) -> _Head | None:
    """An EAGLE head's config and weights, checked against the target; None without one. Under
    tensor parallelism every rank holds the whole head."""
    config = engine_config.speculative_config
    if config is None or config.method not in HEAD_METHODS:
        return None
    head = read_head(config.model, config.method, target.config)
    return _Head(
        name=config.model,
        config=head.spec.config,
        weights=head.weights.items(),
        build=lambda model: partial(EagleHead, head.spec, model),
        quantization="none",
        tp=SINGLE_PROCESS,
        sliced=head.spec.config.architecture,
        target_layers=head.spec.target_layers,
        predicted_weight_bytes=head.shape.weight_bytes(placement.dtype_name),
    )


def _load_mtp_layer(
    engine_config: EngineConfig,
    target: LoadedModel,
    quantization: str,
    placement: Placement,
    tp: TensorParallel,
) -> _Head | None:
    """The checkpoint's first MTP layer (models/mtp_head.py) in the target's quantization, this
    rank's slice of it; None unless the mtp method drafts."""
    config = engine_config.speculative_config
    if config is None or config.method != MTP:
        return None
    model = engine_config.model
    arch = target.config.architecture
    if not arch.num_nextn_predict_layers:
        raise SpeculativeConfigError(
            f"speculative_config.method 'mtp' drafts with the checkpoint's multi-token-prediction layer, "
            f"and {model} has none (num_nextn_predict_layers is 0); use eagle3, draft_model or ngram"
        )
    if engine_config.load_format == "dummy":
        loaded = LoadedModel(
            target.config,
            random_weights(
                target.config, placement.device, placement.dtype, engine_config.seed, mtp_weight_shapes
            ),
            target.tokenizer,
        )
    else:
        try:
            loaded = load_mtp_layer(model, placement.dtype, engine_config.hf_overrides)
        except ModelLoadError as exc:
            raise SpeculativeConfigError(
                f"speculative_config.method 'mtp' reads the checkpoint's multi-token-prediction layer, "
                f"which {model} does not hold whole ({exc}; copies of a model often leave it out): "
                "serve a checkpoint that has it, or use another method"
            ) from exc
        if loaded.quantization is not None and quantization != loaded.quantization:
            loaded = loaded.dequantized(placement.dtype)
    draft = mtp_draft(arch, quantization)
    sliced = check_tensor_parallel(draft.architecture, tp.size, quantization, loaded.group_size)
    vocab_dtype = cpu_vocab_dtype(placement.device.type, engine_config.dtype)
    predicted = weight_bytes(sliced, quantization, placement.dtype_name, vocab_dtype=vocab_dtype)
    return _Head(
        name=f"{model} (MTP layer)",
        config=mtp_config(target.config),
        weights=loaded.weights,
        build=lambda model: partial(mtp_head, model),
        quantization=quantization,
        tp=tp,
        sliced=sliced,
        target_layers=(arch.num_hidden_layers,),
        predicted_weight_bytes=predicted + draft.whole_parameters * placement.dtype.itemsize,
    )


def _head_proposer(
    engine_config: EngineConfig,
    placement: Placement,
    head: _Head,
    target_runner: ModelRunner,
    max_model_len: int,
) -> tuple[Proposer, ModelRunner, MemoryReport]:
    """The head's proposer (engine/eagle_proposer.py) and runner (one layer's KV cache, for the
    target's tokens and K more per sequence), handed the target's hidden states of every step. Its
    decode (draft) steps have CUDA graphs up to disable_by_batch_size sequences, the most that
    draft. Under tensor parallelism every rank runs the head's steps as rank 0 sends them: an EAGLE
    head, whole on every rank, embeds its tokens with the target's vocabulary-parallel embedding
    (EAGLE-1 also takes the target's LM head), collectives of every rank; an MTP layer is split."""
    config = engine_config.speculative_config
    arch = head.config.architecture
    head_config = dataclasses.replace(
        _draft_engine_config(engine_config, head.sliced, target_runner, placement.dtype_name),
        kv_cache_dtype="auto",
        max_num_seqs=min(engine_config.max_num_seqs, config.disable_by_batch_size),
    )
    runner = ModelRunner(
        head.config,
        head.weights,
        head_config,
        placement,
        max_model_len,
        head.quantization,
        head.tp,
        build=head.build(target_runner.model),
        token_state_width=arch.hidden_size,
    )
    block_manager = make_block_manager(
        runner.pools,
        engine_config.block_size,
        None,
        engine_config.enable_prefix_caching,
        max_model_len,
        engine_config.max_num_batched_tokens,
    )
    proposer = EagleProposer(
        config, runner, block_manager, engine_config.max_num_batched_tokens, engine_config.seed
    )
    target_runner.hand_hidden_states(proposer.record)
    memory = MemoryReport(
        model=head.name,
        quantization=head.quantization,
        dtype=placement.dtype_name,
        kv_cache_dtype=runner.kv_cache_dtype_name,
        weight_bytes=runner.weight_bytes,
        predicted_weight_bytes=head.predicted_weight_bytes,
        kv_bytes_per_block=runner.kv_bytes_per_block,
        block_size=engine_config.block_size,
        num_kv_blocks=runner.num_blocks,
        kv_cache_bytes=runner.kv_cache_bytes,
    )
    return proposer, runner, memory


def _draft_engine_config(
    engine_config: EngineConfig, arch: ModelArchitecture, target_runner: ModelRunner, kv_dtype: str
) -> EngineConfig:
    """A draft's (or head's) engine settings: a KV cache of the target's tokens and K more per
    sequence, in bytes, and none of the target's adapters. The speculative config stays: a draft's
    catch-up steps (the 1 to K + 1 tokens the target accepted, a sequence) replay the same
    short-step CUDA graphs as the target's verify steps."""
    config = engine_config.speculative_config
    tokens = target_runner.num_blocks * engine_config.block_size
    tokens += engine_config.max_num_seqs * config.num_speculative_tokens
    block_bytes = kv_bytes_per_block(arch, engine_config.block_size, kv_dtype)
    budget = -(-tokens // engine_config.block_size) * block_bytes
    return dataclasses.replace(
        engine_config,
        model=config.model,
        quantization="auto",
        kv_cache_memory=float(budget),
        gpu_memory_utilization=None,
        enable_lora=False,
    )


def _proposer(
    engine_config: EngineConfig,
    placement: Placement,
    draft: _Draft | None,
    target_runner: ModelRunner,
    max_model_len: int,
    tp: TensorParallel,
) -> tuple[Proposer | None, ModelRunner | None, MemoryReport | None]:
    """Speculative decoding's proposer and, for a draft model, its runner on this rank's slice and
    the memory its weights and its own KV cache take there: a cache of the target's tokens and K
    more per sequence, in bytes."""
    config = engine_config.speculative_config
    if config is None:
        return None, None, None
    if draft is None:
        return NgramProposer(config), None, None
    loaded, quantization = draft.loaded, draft.quantization
    arch = loaded.config.architecture
    draft_config = _draft_engine_config(
        engine_config, draft.sliced, target_runner, target_runner.kv_cache_dtype_name
    )
    weights = LOAD_PROGRESS.track(loaded.weights, len(weight_shapes(loaded.config)), arch.num_hidden_layers)
    runner = ModelRunner(loaded.config, weights, draft_config, placement, max_model_len, quantization, tp)
    block_manager = make_block_manager(
        runner.pools,
        engine_config.block_size,
        runner.window,
        engine_config.enable_prefix_caching,
        max_model_len,
        engine_config.max_num_batched_tokens,
        runner.state_slots,
    )
    proposer = DraftModelProposer(
        config, runner, block_manager, engine_config.max_num_batched_tokens, engine_config.seed
    )
    memory = _memory_report(config.model, runner, loaded, quantization, draft.sliced, draft_config, placement)
    return proposer, runner, memory


def _memory_report(
    model: str,
    runner: ModelRunner,
    loaded: LoadedModel,
    quantization: str,
    sliced: ModelArchitecture,
    engine_config: EngineConfig,
    placement: Placement,
) -> MemoryReport:
    return MemoryReport(
        model=model,
        quantization=quantization,
        dtype=placement.dtype_name,
        kv_cache_dtype=runner.kv_cache_dtype_name,
        weight_bytes=runner.weight_bytes,
        predicted_weight_bytes=_predicted_weight_bytes(
            loaded, sliced, quantization, engine_config, placement
        ),
        kv_bytes_per_block=runner.kv_bytes_per_block,
        block_size=engine_config.block_size,
        num_kv_blocks=runner.num_blocks,
        kv_cache_bytes=runner.kv_cache_bytes,
    )


def _predicted_weight_bytes(
    loaded: LoadedModel,
    sliced: ModelArchitecture,
    quantization: str,
    engine_config: EngineConfig,
    placement: Placement,
) -> int:
    return weight_bytes(
        sliced,
        quantization,
        placement.dtype_name,
        loaded.gguf_block,
        cpu_vocab_dtype(placement.device.type, engine_config.dtype),
    )


def _check_lora_settings(engine_config: EngineConfig) -> None:
    if not engine_config.enable_lora:
        if engine_config.lora_modules:
            raise ValueError("--lora-modules needs --enable-lora")
        return
    for flag, value in (
        ("--max-loras", engine_config.max_loras),
        ("--max-lora-rank", engine_config.max_lora_rank),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")


def _cap_context(limit: int, capacity: int, engine_config: EngineConfig) -> int:
    """The context length the KV cache can hold: an explicit --max-model-len must fit, the model's
    own limit is lowered to fit."""
    if limit <= capacity:
        return limit
    if engine_config.max_model_len is not None:
        raise ValueError(
            f"--max-model-len {limit} does not fit in the KV cache, which holds {capacity} tokens; "
            "lower --max-model-len or raise --kv-cache-memory"
        )
    logger.warning("the KV cache holds %d tokens; max_model_len lowered from %d to that", capacity, limit)
    return capacity
