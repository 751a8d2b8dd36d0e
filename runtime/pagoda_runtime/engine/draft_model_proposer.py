"""A draft model: draft tokens for speculative decoding from a smaller model with the target's vocabulary.

`--speculative-config '{"model": "<name or path>", "num_speculative_tokens": K}'` loads a second
model (any supported one whose tokenizer is the target's, checked at start-up) with a paged KV
cache of its own: its own model runner, block manager and blocks. The KV budget (--kv-cache-memory
or --gpu-memory-utilization) is split between the two caches in proportion to their bytes per
token, so that the draft's holds the target's tokens (and K more per sequence); both are in the
memory report (MemoryReport.draft). A budget measured from the GPU's memory leaves out the draft's
predicted weights, which are read after the target's cache is sized.

Each decoding sequence has a shadow sequence in that cache. To draft, the shadow is rolled back
to the longest prefix its cache shares with the tokens the host has read (what the target
rejected goes, what it accepted stays), the tokens after that prefix are run through the draft
(the whole prompt, in chunks of the step budget, the first time; the target's last token or two
after that), and K tokens are drawn one decode step after another, each from the draft's
distribution q at the request's temperature (its argmax for a greedy request). The target
verifies them against q (executor/rejection_sampler.py), so the output is the target's whatever
the draft proposes. The shadow's blocks are freed with the sequence: when it finishes, is aborted
or is preempted (it catches up again on its next draft). A draft cache that runs out of blocks
drafts nothing for that sequence, never fails a step. The sequences of a step draft together: one
forward (or one per budget-sized chunk) catches them all up, and each draft position is one
batched decode step of the draft, so a step costs about K draft forwards whatever the batch.

The draft's cache has a prefix cache of its own, as the target's (--enable-prefix-caching): its
full blocks are published as they are computed, keyed by their tokens (and the request's adapter),
and a new shadow starts from the blocks its tokens hit. So a prompt whose prefix the target's
cache holds (a system prompt) is not run through the draft again either, before its first draft.

A grammar-constrained sample drafts from q masked by its grammar: its matcher is advanced along
the draft as it is drawn (and rolled back after), and each position's logits are masked by the
grammar's state there, the batch's constrained rows in one bitmask as the target's. So q is the
distribution each draft token really came from, and puts no mass where the target's masked p has
none. Cutting an unmasked draft at its first forbidden token instead would not be lossless: that
cut depends on the token drawn at the position it removes (executor/rejection_sampler.py). A
draft stops after the token that completes the grammar, none after it being emitted.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.speculative import SpeculativeConfig, SpeculativeConfigError
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.grammar_mask import GrammarMasker, advanced_along
from pagoda_runtime.engine.ngram_proposer import draft_room
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.executor.model_runner import ModelRunner


def check_same_vocabulary(
    target: ModelConfig,
    target_tokenizer: Tokenizer,
    draft: ModelConfig,
    draft_tokenizer: Tokenizer,
    name: str,
) -> None:
    """A draft's token ids must mean the target's: the same embedding rows and the same tokenizer."""
    target_vocab, draft_vocab = target.architecture.vocab_size, draft.architecture.vocab_size
    if (
        draft_vocab != target_vocab
        or draft_tokenizer.backend.get_vocab() != target_tokenizer.backend.get_vocab()
    ):
        raise SpeculativeConfigError(
            f"speculative_config.model {name!r} has a different vocabulary ({draft_vocab} tokens, "
            f"tokenizer {draft_tokenizer.source}) from the target's ({target_vocab} tokens, tokenizer "
            f"{target_tokenizer.source}); use a draft model with the target's tokenizer"
        )


class DraftModelProposer:
    # A draft model's KV at a position is a function of the tokens up to it, drafts included, so
    # its blocks are published as they are computed: a sliding-window pool hands blocks back as
    # the shadow moves on, unpublished ones lost to the cache.
    caches_every_forward = True

    def __init__(
        self,
        config: SpeculativeConfig,
        runner: ModelRunner,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        seed: int | None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.block_manager = block_manager
        self.chunk = max_num_batched_tokens  # the most tokens one catch-up forward runs
        self._shadows: dict[int, Sequence] = {}  # target seq_id -> its sequence in the draft's cache
        # Its host buffers are reused position after position: each position's draws are read
        # (int(...) waits for the device) before the next position's masks are filled.
        self._grammar = GrammarMasker(runner.device)
        self.generator = torch.Generator(device=runner.device)
        if seed is not None:
            self.generator.manual_seed(seed)

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Per sequence, up to its limit of tokens drawn from the draft and their distributions q
        [len, vocab]; none past max_tokens, as the n-gram proposer; a constrained sample's drawn
        from q masked by its grammar. The sequences catch up together and draw each position in one
        batched decode step."""
        wanted = {}  # index in seqs -> its draft length
        for i, (seq, limit) in enumerate(zip(seqs, limits, strict=True)):
            k = draft_room(seq, min(self.config.num_speculative_tokens, limit))
            if not seq.num_pending and k > 0:
                wanted[i] = k
        logits = self._catch_up({i: seqs[i] for i in wanted})
        tokens: dict[int, list[int]] = {i: [] for i in logits}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in logits}
        with ExitStack() as lent:
            # Each constrained sample's matcher follows its draft, and is rolled back on leaving.
            advance = {
                i: lent.enter_context(advanced_along(seqs[i].grammar))
                for i in logits
                if seqs[i].grammar is not None
            }
            while logits:
                logits = self._masked(logits, seqs, advance)
                for i, row in logits.items():
                    params = seqs[i].params
                    q = _distribution(row, params)
                    tokens[i].append(self._draw(q, params, len(self._shadows[seqs[i].seq_id].token_ids)))
                    probs[i].append(q)
                going = {
                    i: tokens[i][-1:]
                    for i in logits
                    if len(tokens[i]) < wanted[i] and _goes_on(seqs[i], advance.get(i), tokens[i][-1])
                }
                logits = self._run(seqs, going)
        return [(tokens[i], torch.cat(probs[i])) if tokens.get(i) else ([], None) for i in range(len(seqs))]

    def _masked(
        self, logits: dict[int, torch.Tensor], seqs: list[Sequence], advance: dict
    ) -> dict[int, torch.Tensor]:
        """The rows with the constrained ones masked by their grammars where their drafts stand."""
        constrained = [i for i in logits if i in advance]
        if not constrained:
            return logits
        rows = self._grammar(torch.cat([logits[i] for i in constrained]), [seqs[i] for i in constrained])
        return logits | {i: rows[k : k + 1] for k, i in enumerate(constrained)}

    def free(self, seq: Sequence) -> None:
        shadow = self._shadows.pop(seq.seq_id, None)
        if shadow is not None:
            self.block_manager.free(shadow)

    def _catch_up(self, seqs: dict[int, Sequence]) -> dict[int, torch.Tensor]:
        """Roll each shadow back to what its cache still holds of its sequence (`_rollback`) and run
        the rest (at least the last token, whose logits the first draft token is drawn from), at
        most `chunk` tokens a forward: each sequence's logits [1, vocab] after its last token."""
        todo = {}
        for i, seq in seqs.items():
            shadow = self._shadows.get(seq.seq_id)
            if shadow is None:
                shadow = self._shadows[seq.seq_id] = self._admitted(seq)
            todo[i] = self._rollback(seq, shadow)
            self.block_manager.cache_computed_blocks(shadow)
        logits = {}
        while todo:
            budget, chunks = self.chunk, {}
            for i, rest in todo.items():
                if budget == 0:
                    break
                chunks[i] = rest[:budget]
                budget -= len(chunks[i])
            out = self._run(seqs, chunks)
            for i, chunk in chunks.items():
                rest = todo.pop(i)[len(chunk) :]
                if i in out and rest:
                    todo[i] = rest
                elif i in out:
                    logits[i] = out[i]
        return logits

    def _admitted(self, seq: Sequence) -> Sequence:
        """A new shadow for `seq`, holding the blocks of the draft's prefix cache that its first
        tokens hit (`_shadow_tokens`); none when the cache has no room for them."""
        shadow = Sequence(seq.group, seq.index)
        shadow.cache_salt = self._cache_salt(seq)
        shadow.token_ids = self._shadow_tokens(seq)
        prefix = self.block_manager.find_prefix(shadow)
        if prefix and self.block_manager.can_admit(shadow, prefix, 0):
            self.block_manager.admit(shadow, prefix, 0)
        self._trim(shadow, shadow.num_computed_tokens)
        return shadow

    def _shadow_tokens(self, seq: Sequence) -> list[int]:
        """The tokens a shadow holds once caught up: the sequence's, the draft's KV of each position
        a function of those up to it, so that its blocks are cached by their tokens as the target's."""
        return list(seq.token_ids)

    def _cache_salt(self, seq: Sequence) -> object:
        """What the draft's KV depends on beyond the shadow's tokens (and the request's adapter)."""
        return seq.cache_salt

    def _rollback(self, seq: Sequence, shadow: Sequence) -> list[int]:
        """Cut the shadow back to the longest prefix its cache shares with the sequence's read tokens
        (what the target rejected goes, what it accepted stays); the tokens to run after it."""
        known = seq.token_ids
        computed = shadow.token_ids[: shadow.num_computed_tokens]
        # A sequence's read tokens only grow, so only the shadow's last draft tokens can differ.
        tail = min(max(0, len(computed) - self.config.num_speculative_tokens), len(known))
        same = tail + next(
            (j for j, (a, b) in enumerate(zip(computed[tail:], known[tail:], strict=False)) if a != b),
            min(len(computed), len(known)) - tail,
        )
        same = min(same, len(known) - 1)
        self._trim(shadow, same)
        return known[same:]

    def _trim(self, shadow: Sequence, length: int) -> None:
        shadow.token_ids = shadow.token_ids[:length]
        shadow.num_computed_tokens = length
        # Hashes past the cut were of tokens that may come back different (drafts, lookups).
        del shadow.block_hashes[length // self.block_manager.block_size :]
        self.block_manager.trim(shadow)

    def _run(
        self, seqs: list[Sequence] | dict[int, Sequence], new: dict[int, list[int]]
    ) -> dict[int, torch.Tensor]:
        """Append each sequence's `new` tokens to its shadow and compute them in one forward: the
        logits [1, vocab] after each one's last token. A shadow the draft's cache has no room for
        is freed and left out."""
        batch, order = ScheduledBatch(), []
        for i, tokens in new.items():
            seq = seqs[i]
            shadow = self._shadows[seq.seq_id]
            if not self.block_manager.can_append(shadow, len(tokens)):
                self.free(seq)
                continue
            self.block_manager.append(shadow, len(tokens))
            shadow.token_ids += tokens
            batch.seqs.append(shadow)
            batch.num_new_tokens.append(len(tokens))
            order.append(i)
        if not order:
            return {}
        logits = self._forward(batch)
        for shadow, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            shadow.num_computed_tokens += n
            if self.caches_every_forward:
                self.block_manager.cache_computed_blocks(shadow)
        return {i: logits[row : row + 1] for row, i in enumerate(order)}

    def _forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """The logits [sequences, vocab] after each shadow's last new token."""
        return self.runner.forward_logits(batch)

    def _draw(self, q: torch.Tensor, params: SamplingParams, position: int) -> int:
        if params.temperature == 0.0:
            return int(q.argmax())
        generator = self.generator
        if params.seed is not None:
            # A seeded request drafts the same tokens each time, so that its output repeats.
            generator = torch.Generator(device=q.device).manual_seed(
                hash((params.seed, position)) & (2**63 - 1)
            )
        return int(torch.multinomial(q[0], 1, generator=generator))


def _distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """q [1, vocab]: the draft's softmax at the request's temperature, a point mass on its argmax
    for a greedy request (the target then keeps it exactly when it is the target's argmax)."""
    if params.temperature == 0.0:
        return torch.zeros_like(logits).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.softmax(logits.float() / params.temperature, dim=-1)


def _goes_on(seq: Sequence, advance_by, token: int) -> bool:
    """Whether a draft goes on after `token`: a constrained sample's matcher takes it (always: it
    was drawn from the masked q) and is not at the grammar's end, after which nothing is emitted."""
    return advance_by is None or (advance_by(token) and not seq.grammar.is_stopped())
