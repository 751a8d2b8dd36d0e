"""Logits -> next tokens, one row per sequence that samples this step.

Penalties and the min_tokens mask change the logits for greedy and random rows alike; temperature,
top-k, top-p and min-p shape the distribution of random rows, which then draw with the
exponential race (argmax of p / Exp(1) noise). A seeded sequence draws its noise from its own
generator, so its tokens do not depend on what else is in the batch. Logprobs come from the raw
model distribution, before any of this, as in vLLM.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from pagoda_runtime.engine.grammar_mask import GrammarMasker
from pagoda_runtime.engine.outputs import TokenLogprobs
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.executor.devices import host_list_on

# Odd 64-bit constant (the golden ratio's) that spreads one seed over the samples of a request.
_SEED_STRIDE = 0x9E3779B97F4A7C15


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


@dataclass
class DeviceSamples:
    """A step's samples while they may still be computing: to_host waits for the device, so
    the engine can do host work between sampling and reading them (engine.py)."""

    tokens: torch.Tensor  # [rows]
    params: list[SamplingParams]
    # With logprobs asked for: the chosen token's logprob, and the top values and their ids.
    chosen: torch.Tensor | None = None
    top_values: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    def to_host(self) -> SamplerOutput:
        token_ids = self.tokens.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(token_ids)
        if self.chosen is None:
            return SamplerOutput(token_ids, logprobs)
        chosen, top_values, top_ids = self.chosen.tolist(), self.top_values.tolist(), self.top_ids.tolist()
        for i, p in enumerate(self.params):
            if p.logprobs is None:
                continue
            entry = {token_ids[i]: chosen[i]}
            for token, value in zip(top_ids[i][: p.logprobs], top_values[i][: p.logprobs], strict=True):
                entry.setdefault(token, value)
            logprobs[i] = entry
        return SamplerOutput(token_ids, logprobs)


class Sampler:
    def __init__(self, device: torch.device, eos_token_ids: Seq[int], seed: int = 0) -> None:
        self.device = device
        self.eos_token_ids = tuple(eos_token_ids)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        # Keyed weakly, so that a sequence's generator goes with the sequence and nobody has to
        # tell the sampler when one finishes.
        self._seeded: weakref.WeakKeyDictionary[Sequence, torch.Generator] = weakref.WeakKeyDictionary()
        self._grammar = GrammarMasker(device)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> DeviceSamples:
        """Queue the sampling of one token per row; nothing here waits for the device (every
        host value goes over in a non-blocking copy), so the forward may still be running."""
        params = [seq.params for seq in seqs]
        raw_logprobs = None
        if any(p.logprobs is not None for p in params):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._penalize(logits, seqs)
        logits = self._mask_min_tokens(logits, seqs)
        logits = self._grammar(logits, seqs)

        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = self._on_device(random_rows, torch.int64)
            tokens[rows] = self._sample(logits[rows], [seqs[i] for i in random_rows])
        samples = DeviceSamples(tokens, params)
        if raw_logprobs is not None:
            top_n = max(p.logprobs or 0 for p in params)
            samples.chosen = raw_logprobs.gather(1, tokens[:, None])[:, 0]
            samples.top_values, samples.top_ids = raw_logprobs.topk(top_n, dim=-1)
        return samples

    def _on_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        return host_list_on(self.device, values, dtype)

    def _penalize(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [seq.params for seq in seqs]
        if all(p.repetition_penalty == 1.0 for p in params) and all(
            p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 for p in params
        ):
            return logits
        batch, vocab = logits.shape
        device = logits.device

        def counts(token_lists: list[list[int]]) -> torch.Tensor:
            rows = self._on_device([i for i, ids in enumerate(token_lists) for _ in ids], torch.long)
            ids = self._on_device([t for ids in token_lists for t in ids], torch.long)
            # scatter_add_: atomic adds in one kernel, where index_put_(accumulate=True) sorts first.
            counted = torch.zeros(batch * vocab, device=device)
            counted.scatter_add_(0, rows * vocab + ids, torch.ones(len(ids), device=device))
            return counted.view(batch, vocab)

        output_counts = counts([seq.output_token_ids for seq in seqs])
        prompt_seen = counts([list(seq.group.prompt_token_ids) for seq in seqs]) > 0
        logits = logits.clone()
        repetition = self._on_device([p.repetition_penalty for p in params], torch.float32)[:, None]
        seen = prompt_seen | (output_counts > 0)
        # vLLM's (and CTRL's) rule: shrink positive logits, push negative ones further down.
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)
        frequency = self._on_device([p.frequency_penalty for p in params], torch.float32)[:, None]
        presence = self._on_device([p.presence_penalty for p in params], torch.float32)[:, None]
        return logits - frequency * output_counts - presence * (output_counts > 0).float()

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, ids = [], []
        vocab = logits.shape[1]
        for i, seq in enumerate(seqs):
            p = seq.params
            if seq.num_output_tokens < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                # The engine refuses ids outside the vocabulary; one that got here cannot be sampled anyway.
                stops = {t for t in stops if 0 <= t < vocab}
                rows.extend([i] * len(stops))
                ids.extend(stops)
        if not rows:
            return logits
        logits = logits.clone()
        logits[self._on_device(rows, torch.long), self._on_device(ids, torch.long)] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        params = [seq.params for seq in seqs]
        device = logits.device
        temperature = self._on_device([p.temperature for p in params], torch.float32)[:, None]
        logits = logits / temperature
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = _top_k_top_p(logits, params, self._on_device)
        if any(p.min_p > 0.0 for p in params):
            probs = torch.softmax(logits, dim=-1)
            min_p = self._on_device([p.min_p for p in params], torch.float32)[:, None]
            logits = logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if unseeded:
            noise[self._on_device(unseeded, torch.long)] = torch.empty(
                len(unseeded), probs.shape[1], device=device
            ).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.params.seed is not None:
                noise[i].exponential_(generator=self._generator_of(seq))
        return (probs / noise).argmax(dim=-1)

    def _generator_of(self, seq: Sequence) -> torch.Generator:
        generator = self._seeded.get(seq)
        if generator is None:
            generator = torch.Generator(device=self.device)
            generator.manual_seed((seq.params.seed + seq.index * _SEED_STRIDE) % 2**63)
            self._seeded[seq] = generator
        return generator


def _top_k_top_p(
    logits: torch.Tensor, params, on_device: Callable[[list, torch.dtype], torch.Tensor]
) -> torch.Tensor:
    """Mask all but the top-k tokens, then all but the smallest set whose probability reaches top-p."""
    device = logits.device
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)[None, :]
    # top_k beyond the vocabulary is no limit (and may not fit the tensor).
    top_k = on_device([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], torch.int64)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    top_p = on_device([p.top_p for p in params], torch.float32)[:, None]
    # A token stays while the tokens ranked above it hold less than top_p; the best always stays.
    outside = (probs.cumsum(dim=-1) - probs) >= top_p
    outside[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
