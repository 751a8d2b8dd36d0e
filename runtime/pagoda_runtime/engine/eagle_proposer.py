"""An EAGLE head: draft tokens for speculative decoding from the target's own hidden states.

`--speculative-config '{"method": "eagle3", "model": "<head folder>", "num_speculative_tokens": K}'`
(or `"method": "eagle"`) loads a published head (executor/models/eagle_head.py): one decoder layer
that reads the target's hidden states, so that it drafts far better than a model of its size
could alone. Heads that fit targets Pagoda serves: EAGLE-3 yuhuili/EAGLE3-LLaMA3.1-Instruct-8B for
Llama-3.1-8B-Instruct and Tengyunw/qwen3_8b_eagle3 (or AngelSlim/Qwen3-8B_eagle3) for Qwen3-8B;
EAGLE-1 yuhuili/EAGLE-LLaMA3-Instruct-8B for Meta-Llama-3-8B-Instruct. The head is given as a
local folder (config.json and model.safetensors or pytorch_model.bin); this runtime downloads
none, and its tests write heads in the published layout.

The target's model runner hands over the hidden states the head reads (ModelRunner.
hand_hidden_states) for every token of every step, its CUDA graphs computing them too; nothing of
this happens without an EAGLE proposer. The head keeps its own small paged KV cache with the draft model's
machinery (engine/draft_model_proposer.py): a shadow sequence per decoding sequence, caught up
before each draft, rolled back, freed when the sequence finishes, is aborted or is preempted. At
position p the shadow holds token p + 1 and the target's hidden state at p; a position the head
computed from its own hidden state (a draft) is run again from the target's once the target has
verified it. Under tensor parallelism the proposer is rank 0's and every rank holds the whole
head, running its steps as rank 0 sends them, each with the hidden states its tokens take
(engine/build.py). Drafting is as a draft model's: the first token from the caught-up head's logits,
each next one from a head step fed the token just drawn and the head's own hidden state, K in all;
q is the head's softmax at the request's temperature over the target's vocabulary (zero outside an
EAGLE-3 head's draft vocabulary), so the rejection sampler keeps the output exactly the target's.

On CUDA the head's runner replays CUDA graphs as a draft model's does (unless --enforce-eager):
its draft steps those of its decode batch sizes up to disable_by_batch_size, its catch-up steps of
at most 1 + K tokens a sequence its short-step graphs; a longer catch-up (a prompt's) runs eagerly.
The hidden states `_forward` gives the head are copied into a static buffer before a replay, and
the head's outputs read back from another (ModelRunner token_state_width).

The target's hidden states wait per sequence until its head catches up: at its next draft, or once
a step budget of them has piled up (a long prompt, a sequence not drafting while the batch is
above disable_by_batch_size), so that they never hold more than two step budgets.

The head's cache is prefix-cached as a draft model's: its KV at position p is computed from the
layer's input there alone (one layer), token p + 1 and the target's hidden state at p, a function
of the target's tokens up to p + 1; its blocks are keyed by the shadow's tokens, the target's first
token and the adapter. So where the target's cache hits a prompt's prefix, the head's hits it too
(both publish what they computed of it). A position whose hidden state the target never computed
here and the head's cache does not hold (a prefix the target cached while the head did not run
it: a sequence that finished without drafting, a head that ran out of blocks) is given zeros, and
its block is cached so: the head drafts worse there, never wrongly.
"""

from __future__ import annotations

import torch

from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.block_manager import BlockManager
from pagoda_runtime.engine.draft_model_proposer import DraftModelProposer
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.executor.model_runner import ModelRunner
from pagoda_runtime.executor.models.eagle_head import EagleHead


class EagleProposer(DraftModelProposer):
    # A draft position is computed from the head's own hidden state, not the target's: blocks are
    # published only as the shadow is rolled back to the positions run from the target's.
    caches_every_forward = False

    def __init__(
        self,
        config: SpeculativeConfig,
        runner: ModelRunner,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        seed: int | None,
    ) -> None:
        super().__init__(config, runner, block_manager, max_num_batched_tokens, seed)
        self.head: EagleHead = runner.model
        # target seq_id -> (first position, the target's hidden states from there) not yet run.
        self._features: dict[int, tuple[int, torch.Tensor]] = {}
        self._fed: dict[int, int] = {}  # target seq_id -> shadow positions run from target states
        self._inputs: dict[int, torch.Tensor] = {}  # shadow seq_id -> hidden states of its next tokens

    def record(self, batch: ScheduledBatch, hidden: torch.Tensor) -> None:
        """A target step's hidden states [tokens, width], its sequences' new tokens in order (the
        target runner calls this as it launches the step, before the scheduler counts it)."""
        first = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, chunk = seq.num_computed_tokens, hidden[first : first + n]
            first += n
            held = self._features.get(seq.seq_id)
            if held is not None and held[0] <= start <= held[0] + held[1].shape[0]:
                # What this step computes again (rejected draft positions) is replaced.
                self._features[seq.seq_id] = (held[0], torch.cat([held[1][: start - held[0]], chunk]))
            else:
                self._features[seq.seq_id] = (start, chunk.clone())
            held_from = self._features[seq.seq_id][0]
            if start - held_from >= self.chunk and len(seq.token_ids) > start and not seq.num_pending:
                self._catch_up({0: seq})

    def free(self, seq: Sequence) -> None:
        shadow = self._shadows.get(seq.seq_id)
        if shadow is not None:
            self._inputs.pop(shadow.seq_id, None)
        self._features.pop(seq.seq_id, None)
        self._fed.pop(seq.seq_id, None)
        super().free(seq)

    def _admitted(self, seq: Sequence) -> Sequence:
        shadow = super()._admitted(seq)
        self._fed[seq.seq_id] = shadow.num_computed_tokens
        return shadow

    def _shadow_tokens(self, seq: Sequence) -> list[int]:
        """Position p holds token p + 1: the head's KV there is computed from that token and the
        target's hidden state at p alone (one layer), a function of the tokens up to p + 1."""
        return seq.token_ids[1 : seq.num_computed_tokens + 1]

    def _cache_salt(self, seq: Sequence) -> object:
        """The target's hidden states also depend on its first token, which no shadow holds."""
        return ("eagle", seq.token_ids[0], seq.cache_salt)

    def _rollback(self, seq: Sequence, shadow: Sequence) -> list[int]:
        """Keep the shadow's positions run from the target's hidden states that the target still
        holds, and run the others up to the target's last computed position c - 1 (at least that
        one, whose logits give the first draft token) from the target's hidden states: the tokens
        after each position, up to the sequence's last one."""
        computed = seq.num_computed_tokens
        keep = min(self._fed.get(seq.seq_id, 0), shadow.num_computed_tokens, computed - 1)
        self._trim(shadow, keep)
        self._inputs[shadow.seq_id] = self.head.project(self._target_states(seq, keep, computed))
        self._fed[seq.seq_id] = computed
        return seq.token_ids[keep + 1 : computed + 1]

    def _target_states(self, seq: Sequence, start: int, end: int) -> torch.Tensor:
        """The target's hidden states at positions [start, end), zeros where none is held; those
        before `end` are let go."""
        first, held = self._features.pop(seq.seq_id, (end, None))
        width = len(self.head.target_layers) * self.head.config.architecture.hidden_size
        states = torch.zeros(end - start, width, device=self.runner.device, dtype=self.runner.dtype)
        if held is not None:
            lo, hi = max(start, first), min(end, first + held.shape[0])
            if lo < hi:
                states[lo - start : hi - start] = held[lo - first : hi - first]
            if first + held.shape[0] > end:
                self._features[seq.seq_id] = (end, held[max(0, end - first) :])
        return states

    def _forward(self, batch: ScheduledBatch) -> torch.Tensor:
        """The head's forward, each token given its hidden state: the target's while catching up,
        the head's own output at the position before while drafting."""
        rows = []
        for shadow, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            pending = self._inputs[shadow.seq_id]
            rows.append(pending[:n])
            self._inputs[shadow.seq_id] = pending[n:]
        self.head.inputs = torch.cat(rows)
        logits = self.runner.forward_logits(batch)
        ends = torch.tensor(batch.num_new_tokens, device=self.runner.device).cumsum(0) - 1
        last = self.head.outputs[ends]
        self.head.inputs = self.head.outputs = None
        for k, shadow in enumerate(batch.seqs):
            if self._inputs[shadow.seq_id].shape[0] == 0:
                self._inputs[shadow.seq_id] = last[k : k + 1]
        return logits
