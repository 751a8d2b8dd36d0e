"""Embeddings of pooled sequences (--runner pooling, contract/pooling.py), built from the final
hidden states the model runner hands over as each step launches (ModelRunner.hand_hidden_states).

A pooled sequence runs its prompt, in as many chunks as the token budget takes, and samples one
token that is never shown (the engine's way of ending a sequence after its prefill); the pooler
keeps per sequence what its pooling needs of each chunk: the running sum (MEAN), the first token's
state (CLS) or the last prompt token's (LAST), in float32. A sequence preempted and recomputed from
its first token starts over.
"""

from __future__ import annotations

import torch

from pagoda_runtime.contract.pooling import PoolerConfig, PoolingParams
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.engine.sequence import Sequence

# How a pooled request runs: its prompt, then one greedy token that ends it (not shown).
EMBEDDING_RUN = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


class Pooler:
    def __init__(self, config: PoolerConfig, head: torch.Tensor | None = None) -> None:
        """head: a sequence classifier's [outputs, hidden] float32 weights (loading/classifier_head.py),
        applied to the pooled state; None for an embedding model."""
        self.config = config
        self.head = head
        self._held: dict[int, torch.Tensor] = {}  # seq_id -> sum (MEAN) or the pooled state

    def record(self, batch: ScheduledBatch, hidden: torch.Tensor) -> None:
        """A step's final hidden states [tokens, hidden], its sequences' new tokens in order."""
        first = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start, rows = seq.num_computed_tokens, hidden[first : first + n]
            first += n
            if start >= seq.num_prompt_tokens:
                continue  # the token after the prompt: nothing of the embedding
            rows = rows[: seq.num_prompt_tokens - start]
            kind = self.config.pooling_type
            if kind == "MEAN":
                total = rows.float().sum(dim=0)
                held = self._held.get(seq.seq_id)
                self._held[seq.seq_id] = total if start == 0 or held is None else held + total
            elif kind == "CLS" and start == 0:
                self._held[seq.seq_id] = rows[0].float().clone()
            elif kind == "LAST" and start + rows.shape[0] == seq.num_prompt_tokens:
                self._held[seq.seq_id] = rows[-1].float().clone()

    def pop(self, seq: Sequence, params: PoolingParams) -> list[float]:
        """The finished sequence's embedding, cut to the dimensions asked for (then normalized,
        the Matryoshka way), or a classifier's probabilities (one output: its sigmoid); the pooler
        forgets it."""
        vector = self._held.pop(seq.seq_id)
        if self.config.pooling_type == "MEAN":
            vector = vector / seq.num_prompt_tokens
        if self.head is not None:
            logits = self.head.to(vector.device) @ vector
            probs = torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=0)
            return probs.cpu().tolist()
        if params.dimensions is not None:
            vector = vector[: params.dimensions]
        if self.config.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        return vector.cpu().tolist()

    def drop(self, seq: Sequence) -> None:
        """An aborted or failed sequence's partial state."""
        self._held.pop(seq.seq_id, None)
