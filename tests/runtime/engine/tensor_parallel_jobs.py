"""What each tensor-parallel rank runs in test_tensor_parallel.py: module-level functions that a
spawned rank can import without the test's heavier imports (transformers).

`run_tasks(tp, tasks)` runs several jobs in one group of ranks, so a test module spawns one
group per size instead of one per test. `greedy_runs` runs the ranks as the server does: rank 0 an
LLMEngine whose steps go to the others through step_broadcast.py, the others only those steps.
"""

from __future__ import annotations

import itertools

import torch
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.sizing import (
    STATE_SLOTS_BEYOND_SEQS,
    kv_bytes_per_block,
    kv_heads_per_rank,
    state_bytes,
)
from pagoda_runtime.engine.build import build_engine
from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.executor.attention_metadata import AttentionMetadata
from pagoda_runtime.executor.kernels import get_attention_ops
from pagoda_runtime.executor.models import build_model
from pagoda_runtime.loading.model_source import load_model_source
from pagoda_runtime.parallel.step_broadcast import StepReceiver, StepSender

NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROMPTS = [
    "The quick brown fox jumps. She",
    "def add(a, b):",
    "The quick brown fox jumps. He",  # shares whole blocks with the first
]
# Prefill chunks of 8 tokens, prefix caching, and a cache of 7 blocks of 4 tokens that the three
# prompts cannot hold at once: every step kind the scheduler has runs on every rank, in few steps
# (each step costs every rank a round of collectives).
TINY_KV_BLOCKS = 7
TINY_ENGINE = dict(block_size=4, max_num_batched_tokens=8, enable_prefix_caching=True, max_model_len=28)


def sharded_logits(tp, folder: str, quantization: str) -> torch.Tensor:
    """Logits after each token of one prompt, from a model built directly (no engine) on this rank."""
    loaded = load_model_source(folder)
    config = loaded.config
    model = build_model(config, get_attention_ops("cpu"), 64, quantization, tp=tp)
    model.load_weights(loaded.weights)
    ids = torch.tensor(loaded.tokenizer.encode(PROMPTS[0]))
    n, block_size = ids.shape[0], 4
    blocks = -(-n // block_size)
    arch = config.architecture
    shape = arch.kv_cache_shape
    kv_heads = kv_heads_per_rank(shape.heads, tp.size)
    caches = [
        torch.zeros(shape.planes, blocks, block_size, kv_heads, shape.head_dim)
        for _ in range(arch.num_hidden_layers)
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        max_query_len=n,
        max_seq_len=n,
    )
    with torch.inference_mode():
        return model.compute_logits(model(ids, torch.arange(n), caches, meta))


def greedy_runs(tp, jobs: list[tuple[str, str, dict]], prompts: list[str] = PROMPTS) -> dict[str, dict]:
    """job name -> what rank 0's engine did (see _drive)."""
    runs = {}
    for name, model, settings in jobs:
        settings = dict(settings)
        kv_blocks = settings.pop("kv_blocks", None)
        if kv_blocks is not None:
            arch = load_model_source(model).config.architecture.per_rank(tp.size)
            per_block = kv_bytes_per_block(arch, settings["block_size"], "float32")
            # A hybrid model's recurrent states come out of the same budget first.
            states = (settings.get("max_num_seqs", 0) + STATE_SLOTS_BEYOND_SEQS) * state_bytes(
                arch, "float32"
            )
            settings["kv_cache_memory"] = kv_blocks * per_block + states
        # Groups launch each step before reading the last (their input ids broadcast from rank 0's
        # device), one process reads each step first: the ids must match across the two.
        engine_config = _engine_config(tp, model, **settings)
        if tp.is_driver:
            runs[name] = _drive(LLMEngine(engine_config, tp=tp), tp, name, prompts)
        else:
            _follow(build_engine(engine_config, tp=tp).runner, tp)
    return runs


def _drive(engine: LLMEngine, tp, name: str, prompts: list[str]) -> dict:
    """Rank 0, as the server runs it: each step goes to the other ranks before its forward."""
    sender = None
    if tp.size > 1:
        sender = StepSender(tp, engine.runner.device, keepalive_s=3600, on_failure=lambda why: None)
        engine.runner.step_sender = sender
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{name}-{i}", prompt, GREEDY)
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    if sender is not None:
        sender.stop()
    stats = engine.stats()
    return {
        "ids": [finished[f"{name}-{i}"].outputs[0].token_ids for i in range(len(prompts))],
        "preemptions": stats.num_preemptions,
        "prefix_hits": stats.prefix_cache_hits,
        "kv_heads": engine.model_config.architecture.kv_cache_shape.heads,
        "kv_bytes_per_block": engine.memory.kv_bytes_per_block,
        "weight_bytes": engine.memory.weight_bytes,
        "predicted_weight_bytes": engine.memory.predicted_weight_bytes,
    }


def _follow(runner, tp) -> None:
    """Every other rank, as rank_worker.py runs it: the steps rank 0 sends, until it says stop."""
    receiver = StepReceiver(tp, runner.device, runner.receive_lora)
    while (received := receiver.receive()) is not None:
        runner.run(received[1])


def run_tasks(tp, tasks: dict[str, tuple[str, tuple]]) -> dict:
    """task name -> (function name in this module, its arguments) -> task name -> its result."""
    return {name: globals()[function](tp, *args) for name, (function, args) in tasks.items()}


def lora_runs(tp, model: str, adapters: dict[str, str], jobs: dict[str, dict]) -> dict[str, dict]:
    """job name -> (rank 0) each prompt's greedy ids with the base model and with each adapter, in
    one run through fewer device slots than adapters, each adapter loaded live while the others run;
    and how often adapters were swapped into a slot (each swap reaches every rank)."""
    return {name: _lora_run(tp, model, adapters, settings) for name, settings in jobs.items()}


def _lora_run(tp, model: str, adapters: dict[str, str], settings: dict) -> dict:
    engine_config = _engine_config(tp, model, enable_lora=True, **settings)
    if not tp.is_driver:
        _follow(build_engine(engine_config, tp=tp).runner, tp)
        return {}
    engine = LLMEngine(engine_config, tp=tp)
    sender = None
    if tp.size > 1:
        sender = StepSender(tp, engine.runner.device, keepalive_s=3600, on_failure=lambda why: None)
        engine.runner.step_sender = sender
    *first, last = adapters
    # The requests that join at steps 0, 1 and 2, each adapter loaded as its requests join: the
    # first step has no adapter token, the later ones mix adapters and the base model.
    joining = [[None], first, [last]]
    finished = {}
    for step in itertools.count():
        if step < len(joining):
            for name in joining[step]:
                if name is not None:
                    engine.add_lora(name, adapters[name])
                for i, prompt in enumerate(PROMPTS[:2]):
                    engine.add(engine.make_request(f"{name}-{i}", prompt, GREEDY, lora_name=name))
        elif not engine.has_unfinished():
            break
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    if sender is not None:
        sender.stop()
    return {
        "ids": {
            name: [finished[f"{name}-{i}"].outputs[0].token_ids for i in range(2)]
            for name in (None, *adapters)
        },
        "swaps": engine.loras.num_swaps,
    }


def _engine_config(tp, model: str, **settings) -> EngineConfig:
    """A float32 CPU engine over the group's ranks; groups launch each step before reading the last."""
    return EngineConfig(
        model=model,
        dtype="float32",
        device="cpu",
        tensor_parallel_size=tp.size,
        async_scheduling=tp.size > 1,
        **settings,
    )
