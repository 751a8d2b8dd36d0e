"""Logits -> next tokens, one row per sequence that samples this step.

Penalties, logit_bias, allowed_token_ids, bad_words, the min_tokens mask and grammar masks change
the logits for greedy and random rows alike; temperature, top-k, top-p and min-p shape the
distribution of random rows, which then draw with the exponential race (argmax of p / E, E ~ Exp(1)
noise). On CUDA one Triton kernel does the random rows (kernels/triton_sampling.py); elsewhere
`truncated_race`, its reference, does. A seeded sample's noise comes from a seed derived from its
seed, its index among the request's samples and its position, so its tokens depend on nothing else
in the batch and are the same whenever it is sampled. Logprobs come from the raw model distribution,
before any of this, as in vLLM. A verify step (speculative decoding) has a row per drafted position
and per sequence's bonus position; its processed logits become the distributions
rejection_sampler.py accepts drafts against, each row's penalties and bad words counting the draft
tokens before it and each row's grammar mask following them (grammar_mask.py).

What the host knows when a step is launched (which rows draw, their parameters, the min_tokens mask)
goes over with the step's inputs in one copy (`host_arrays`, staging.py); penalties, bad words and
grammar masks need the sequence's previous tokens, so with async scheduling the engine samples a
batch holding them only once it has read the step before (llm_engine.py). Nothing here waits for the
device: the tokens and logprobs go back in non-blocking copies that `DeviceSamples.to_host` waits
for.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from pagoda_runtime.engine.grammar_mask import GrammarMasker
from pagoda_runtime.engine.outputs import TokenLogprobs
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.executor.devices import host_list_on
from pagoda_runtime.executor.host_copy import HostCopy
from pagoda_runtime.executor.rejection_sampler import Drafts, rejection_sample, target_probs

# Odd 64-bit constant (the golden ratio's) that spreads one seed over the samples of a request.
_SEED_STRIDE = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def row_seed(seed: int, index: int, position: int) -> int:
    """The noise seed of a seeded sample's token at `position` (its output index): splitmix64 of
    the three, as a non-negative int64."""
    z = (seed + index * _SEED_STRIDE + (position + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def uses_history(seq: Sequence) -> bool:
    """Whether sampling this sequence reads its previous tokens: penalties count them, a grammar
    follows them, a bad word of several tokens is banned after the rest of it."""
    params = seq.params
    bad_words = seq.group.bad_words
    return (
        params.structured_outputs is not None
        or (bad_words is not None and bad_words.needs_history)
        or params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprobs | None]
    # Of a verify step: per sequence, how many of its rows' tokens are emitted.
    num_emitted: list[int] | None = None


@dataclass
class DeviceSamples:
    """A step's samples while they may still be computing: on CUDA they are on their way to
    pinned host memory, and to_host waits for that copy only."""

    tokens: torch.Tensor  # [rows], on the device: the next step's input ids are read from it
    params: list[SamplingParams]
    # With logprobs asked for: the chosen token's logprob, and the top values and their ids.
    chosen: torch.Tensor | None = None
    top_values: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    emitted: torch.Tensor | None = None  # of a verify step: per sequence, the rows emitted
    _copy: HostCopy | None = None

    def start_copy(self) -> None:
        """Queue the copies to the host."""
        parts = (self.tokens, self.emitted, self.chosen, self.top_values, self.top_ids)
        self._copy = HostCopy([t for t in parts if t is not None])

    def to_host(self) -> SamplerOutput:
        host = self._copy.wait()
        token_ids = host[0].tolist()
        emitted = None if self.emitted is None else host[1].tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(token_ids)
        if self.chosen is None:
            return SamplerOutput(token_ids, logprobs, emitted)
        chosen, top_values, top_ids = (t.tolist() for t in host[-3:])
        for i, p in enumerate(self.params):
            if p.logprobs is not None:
                logprobs[i] = logprob_entry(token_ids[i], chosen[i], top_ids[i], top_values[i], p.logprobs)
        return SamplerOutput(token_ids, logprobs, emitted)


def logprob_entry(
    token: int, value: float, top_ids: list[int], top_values: list[float], top_k: int
) -> TokenLogprobs:
    """{token id: logprob}: the chosen token's, then the top k's (the chosen one among them once)."""
    entry = {token: value}
    for other, other_value in zip(top_ids[:top_k], top_values[:top_k], strict=True):
        entry.setdefault(other, other_value)
    return entry


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, eos_token_ids: Seq[int], seed: int = 0) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        # Unseeded rows: one draw for all of them on the CPU, a seed per row for the kernel.
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self._seeds = np.random.default_rng(seed)
        self._grammar = GrammarMasker(device)

    def host_arrays(self, seqs: list[Sequence], output_index: list[int]) -> dict[str, np.ndarray]:
        """What the device needs to sample these rows that the host knows at launch: the random
        rows and their parameters, and the logits the min_tokens rule masks (flat indices).
        output_index[i]: how many output tokens row i's sequence has before the one sampled."""
        params = [seq.group.params for seq in seqs]
        random = [i for i, p in enumerate(params) if p.temperature != 0.0]
        chosen = [params[i] for i in random]
        seeds = np.empty(len(random), dtype=np.int64)
        unseeded = [k for k, p in enumerate(chosen) if p.seed is None]
        if unseeded:
            seeds[unseeded] = self._seeds.integers(0, 2**63 - 1, len(unseeded), dtype=np.int64)
        for k, i in enumerate(random):
            if chosen[k].seed is not None:
                seeds[k] = row_seed(chosen[k].seed, seqs[i].index, output_index[i])
        masked: list[int] = []
        biased: list[int] = []
        bias: list[float] = []
        restricted: list[int] = []  # rows with allowed_token_ids
        allowed: list[np.ndarray] = []  # flat indices into those rows only
        for i, p in enumerate(params):
            if p.logit_bias:
                biased.extend(i * self.vocab_size + t for t in p.logit_bias)
                bias.extend(p.logit_bias.values())
            if p.allowed_token_ids:
                ids = np.asarray(p.allowed_token_ids, dtype=np.int64)
                allowed.append(ids + len(restricted) * self.vocab_size)
                restricted.append(i)
            if output_index[i] < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                # The engine refuses ids outside the vocabulary; one that got here would index
                # another row's logits.
                masked.extend(i * self.vocab_size + t for t in sorted(stops) if 0 <= t < self.vocab_size)
        return {
            "random_rows": np.array(random, dtype=np.int64),
            "temperature": np.array([p.temperature for p in chosen], dtype=np.float32),
            # top_k beyond the vocabulary is no limit (and may not fit int32).
            "top_k": np.array([min(p.top_k, self.vocab_size) for p in chosen], dtype=np.int32),
            "top_p": np.array([p.top_p for p in chosen], dtype=np.float32),
            "min_p": np.array([p.min_p for p in chosen], dtype=np.float32),
            "seeds": seeds,
            "min_tokens_masked": np.array(masked, dtype=np.int64),
            "logit_bias_index": np.array(biased, dtype=np.int64),  # flat, as min_tokens_masked
            "logit_bias": np.array(bias, dtype=np.float32),
            "restricted_rows": np.array(restricted, dtype=np.int64),
            "allowed_index": np.concatenate(allowed) if allowed else np.zeros(0, dtype=np.int64),
        }

    def __call__(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        output_index: list[int],
        staged: dict[str, torch.Tensor],
        greedy: torch.Tensor | None = None,
        drafts: Drafts | None = None,
    ) -> DeviceSamples:
        """Queue the sampling of one token per row of `logits` [rows, vocab]; `staged`: host_arrays
        on the device; `greedy`: the rows' argmax when the forward computed it (a CUDA graph);
        `drafts`: of a verify step, whose rows are its sequences' drafted and bonus positions."""
        params = [seq.params for seq in seqs]
        raw_logprobs = None
        if any(p.logprobs is not None for p in params):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        prefixes = drafts.row_prefixes() if drafts is not None else [[]] * len(seqs)
        processed = self._penalize(logits, seqs, output_index, prefixes)
        masked, biased = staged["min_tokens_masked"], staged["logit_bias_index"]
        restricted = staged["restricted_rows"]
        writes = masked.shape[0] or biased.shape[0] or restricted.shape[0]
        if processed is logits and (writes or self._grammar.constrains(seqs)):
            processed = logits.clone()  # the bias and the masks below write in place
        if biased.shape[0]:
            processed.view(-1).index_add_(0, biased, staged["logit_bias"].to(processed.dtype))
        if restricted.shape[0]:
            self._allow_only(processed, restricted, staged["allowed_index"])
        banned = self._bad_words(seqs, output_index, prefixes)
        if banned is not None:
            if processed is logits:
                processed = logits.clone()
            processed.view(-1).index_fill_(0, banned, float("-inf"))
        if masked.shape[0]:
            # index_fill_ takes -inf as a kernel argument; assigning it through an index copies
            # it from the host first, which waits for the device.
            processed.view(-1).index_fill_(0, masked, float("-inf"))
        processed = self._grammar(processed, seqs, prefixes if drafts is not None else None)
        emitted = None
        if drafts is not None:
            tokens, emitted = self._verify(processed, params, staged, drafts)
        elif greedy is None or processed is not logits:
            tokens = processed.argmax(dim=-1)
        else:
            tokens = greedy.clone() if staged["random_rows"].shape[0] else greedy
        if drafts is None and staged["random_rows"].shape[0]:
            self._sample(processed, [p for p in params if p.temperature != 0.0], staged, tokens)
        samples = DeviceSamples(tokens, params, emitted=emitted)
        if raw_logprobs is not None:
            top_n = max(p.logprobs or 0 for p in params)
            samples.chosen = raw_logprobs.gather(1, tokens[:, None])[:, 0]
            samples.top_values, samples.top_ids = raw_logprobs.topk(top_n, dim=-1)
        samples.start_copy()
        return samples

    def _allow_only(self, logits: torch.Tensor, rows: torch.Tensor, allowed: torch.Tensor) -> None:
        """Masks every logit of `rows` but the allowed ones (flat indices into those rows alone)."""
        keep = torch.zeros(rows.shape[0] * self.vocab_size, dtype=torch.bool, device=logits.device)
        keep.index_fill_(0, allowed, True)
        chosen = logits.index_select(0, rows).masked_fill_(~keep.view(rows.shape[0], -1), float("-inf"))
        logits.index_copy_(0, rows, chosen)

    def _sample(
        self, logits: torch.Tensor, params: list[SamplingParams], staged: dict[str, torch.Tensor], out
    ) -> None:
        rows = staged["random_rows"]
        if logits.is_cuda:
            from pagoda_runtime.executor.kernels.triton_sampling import sample

            sample(
                logits,
                rows,
                staged["temperature"],
                staged["top_k"],
                staged["top_p"],
                staged["min_p"],
                staged["seeds"],
                out,
            )
            return
        chosen = logits[rows]
        noise = torch.empty_like(chosen)
        unseeded = [k for k, p in enumerate(params) if p.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), chosen.shape[1]).exponential_(
                generator=self.generator
            )
        for k, p in enumerate(params):
            if p.seed is not None:
                generator = torch.Generator().manual_seed(int(staged["seeds"][k]))
                noise[k].exponential_(generator=generator)
        out[rows] = truncated_race(
            chosen,
            staged["temperature"],
            staged["top_k"],
            staged["top_p"],
            staged["min_p"],
            -noise.log(),
            truncates=any(p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0 for p in params),
        )

    def _verify(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        staged: dict[str, torch.Tensor],
        drafts: Drafts,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rejection-sample a verify step's rows (rejection_sampler.py): its tokens and, per
        sequence, how many are emitted. The draws come from the host generators (a seeded row's
        from its own seed), so a seeded sample repeats itself."""
        rows, vocab = logits.shape
        random = staged["random_rows"]
        kept = None
        if random.shape[0]:
            scaled = logits[random] / staged["temperature"][:, None]
            kept = truncation_mask(scaled, staged["top_k"], staged["top_p"], staged["min_p"])
        target = target_probs(logits, random, staged["temperature"], kept)
        # Greedy rows need no draws: their p is a point mass, so u = 0 and noise 1 decide alike.
        uniform = torch.zeros(rows, device=logits.device)
        noise = torch.ones(rows, vocab, device=logits.device)
        chosen = [p for p in params if p.temperature != 0.0]
        if chosen:
            drawn_u, drawn_noise = torch.empty(len(chosen)), torch.empty(len(chosen), vocab)
            for k, p in enumerate(chosen):
                generator = self.generator
                if p.seed is not None:
                    generator = torch.Generator().manual_seed(int(staged["seeds"][k]))
                # The noise first, as _sample draws it: a seeded row that verifies no draft then
                # races the same noise over the same p, and samples the token it would without.
                drawn_noise[k].exponential_(generator=generator)
                drawn_u[k] = torch.rand(1, generator=generator)
            uniform[random] = drawn_u.to(logits.device)
            noise[random] = drawn_noise.to(logits.device)
        draft_tokens = host_list_on(logits.device, drafts.row_tokens(), torch.int64)
        draft_probs = drafts.row_probs(vocab, logits.device)
        return rejection_sample(target, draft_tokens, drafts.widths, uniform, noise, draft_probs)

    def _bad_words(
        self, seqs: list[Sequence], output_index: list[int], prefixes: list[list[int]]
    ) -> torch.Tensor | None:
        """The flat indices of the tokens each row's bad words ban after the output before it, or
        None when they ban none."""
        rows = [i for i, seq in enumerate(seqs) if seq.group.bad_words is not None]
        if not rows:
            return None
        flat = []
        for i in rows:
            bad_words = seqs[i].group.bad_words
            output = outputs_before(seqs[i], output_index[i], prefixes[i]) if bad_words.needs_history else ()
            flat.extend(i * self.vocab_size + t for t in bad_words.banned(output))
        return host_list_on(self.device, flat, torch.int64) if flat else None

    def _penalize(
        self, logits: torch.Tensor, seqs: list[Sequence], output_index: list[int], prefixes: list[list[int]]
    ) -> torch.Tensor:
        """The penalties of each row, counting the output before it: the sequence's first
        output_index tokens, of which the last len(prefix) are a verify step's draft tokens."""
        params = [seq.params for seq in seqs]
        if all(p.repetition_penalty == 1.0 for p in params) and all(
            p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 for p in params
        ):
            return logits
        batch, vocab = logits.shape
        device = logits.device

        def counts(token_lists: list[list[int]]) -> torch.Tensor:
            rows = host_list_on(device, [i for i, ids in enumerate(token_lists) for _ in ids], torch.int64)
            ids = host_list_on(device, [t for ids in token_lists for t in ids], torch.int64)
            # scatter_add_: atomic adds in one kernel, where index_put_(accumulate=True) sorts first.
            counted = torch.zeros(batch * vocab, device=device)
            counted.scatter_add_(0, rows * vocab + ids, torch.ones(len(ids), device=device))
            return counted.view(batch, vocab)

        outputs = [outputs_before(*row) for row in zip(seqs, output_index, prefixes, strict=True)]
        output_counts = counts(outputs)
        prompt_seen = counts([list(seq.group.prompt_token_ids) for seq in seqs]) > 0
        repetition = host_list_on(device, [p.repetition_penalty for p in params], torch.float32)[:, None]
        seen = prompt_seen | (output_counts > 0)
        # vLLM's (and CTRL's) rule: shrink positive logits, push negative ones further down.
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)
        frequency = host_list_on(device, [p.frequency_penalty for p in params], torch.float32)[:, None]
        presence = host_list_on(device, [p.presence_penalty for p in params], torch.float32)[:, None]
        return logits - frequency * output_counts - presence * (output_counts > 0).float()


def outputs_before(seq: Sequence, output_index: int, prefix: list[int]) -> list[int]:
    """The output tokens before a row: the sequence's first output_index, of which the last
    len(prefix) are a verify step's draft tokens (the host has not got them as the sequence's)."""
    start = seq.num_prompt_tokens
    return seq.token_ids[start : start + output_index - len(prefix)] + prefix


def truncated_race(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    gumbel: torch.Tensor,
    truncates: bool = True,
) -> torch.Tensor:
    """The token each row of `logits` [rows, vocab] draws, with Gumbel noise `gumbel` (-log E):
    the reference of kernels/triton_sampling.py, which it matches token for token given the same
    noise. top_k keeps every token at least as large as the k-th (0: all); top_p, over the top-k
    tokens renormalized, keeps a token while the tokens above it hold less than top_p; min_p keeps
    the tokens at least min_p times as probable as the most probable one."""
    x = logits / temperature[:, None]
    score = (x - x.amax(dim=-1, keepdim=True)) + gumbel
    if not truncates:
        return score.argmax(dim=-1)
    return torch.where(truncation_mask(x, top_k, top_p, min_p), score, float("-inf")).argmax(dim=-1)


def truncation_mask(
    x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """The tokens top-k, top-p and min-p keep of each row of temperature-scaled logits `x`, as
    truncated_race describes them."""
    m = x.amax(dim=-1, keepdim=True)
    vocab = x.shape[1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab).long()
    ordered = x.sort(dim=-1, descending=True).values
    threshold = ordered.gather(1, (k - 1)[:, None])
    kept = x >= threshold
    e = torch.exp(x - m)
    kept_mass = (e * kept).sum(dim=-1, keepdim=True)
    ordered_e = torch.exp(ordered - m) * (ordered >= threshold)
    prefix = torch.cat([torch.zeros_like(ordered_e[:, :1]), ordered_e.cumsum(dim=-1)], dim=-1)
    # For each token, how many are strictly larger, and so the mass above it, ties included.
    larger = torch.searchsorted((-ordered).contiguous(), (-x).contiguous(), side="left")
    above = prefix.gather(1, larger)
    return kept & (above < top_p[:, None] * kept_mass) & (e >= min_p[:, None])
