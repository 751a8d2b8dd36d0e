"""The engine's model as a scorer: next-token logits over a whole text, which is how quantization
quality is measured (quantization/quality.py) and how tests compare the engine with a reference."""

from __future__ import annotations

import time

import torch

from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.engine.request_validation import first_out_of_vocabulary
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup


def score(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """Float32 next-token logits [len(token_ids), vocab] of the engine's own model: row i predicts
    token i + 1. One prefill over blocks borrowed from the block manager and given back, so it may
    run between steps while requests hold other blocks."""
    if not token_ids:
        raise ValueError("there is nothing to score; send at least one token")
    vocab = engine.model_config.architecture.vocab_size
    bad = first_out_of_vocabulary(token_ids, vocab)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside the model's vocabulary of {vocab} tokens")
    if len(token_ids) > engine.max_model_len:
        raise ValueError(
            f"{len(token_ids)} tokens exceed max_model_len {engine.max_model_len}; score a shorter text"
        )
    block_manager = engine.block_manager
    group = SequenceGroup("score", list(token_ids), SamplingParams(max_tokens=1), time.monotonic())
    seq = Sequence(group, 0)
    if not block_manager.can_append(seq, seq.num_tokens):
        raise ValueError(
            f"scoring {seq.num_tokens} tokens needs {block_manager.blocks_needed(seq, seq.num_tokens)} "
            f"free KV blocks but {block_manager.num_free_blocks} are free; wait for running requests "
            "to finish"
        )
    block_manager.append(seq, seq.num_tokens)
    try:
        return engine.runner.score(seq)
    finally:
        block_manager.free(seq)
