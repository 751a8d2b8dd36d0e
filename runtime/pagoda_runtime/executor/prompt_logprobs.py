"""Logprobs of a prompt's own tokens: vLLM's `prompt_logprobs`, and what the completions API's
`echo` with `logprobs` reports (evaluation harnesses score a text's likelihood that way).

A sequence that asks for them has, in each step that computes part of its prompt, a logits row for
every prompt position p of the chunk whose next token p + 1 is a prompt token: the logprob of that
token and the top k under the model's own distribution (no temperature, penalties or masks, as
vLLM reports them). The rows follow the sampling rows in the step's logits_rows, so the forward
computes them with the rest (every tensor-parallel rank, since the logits are collectives); only
rank 0 reads them. A step with such rows runs eagerly (a CUDA graph holds sampling rows only).
Their prompt is never taken from the prefix cache (scheduler), so every position is computed, by
the request's first sample, at most PROMPT_LOGPROBS_CHUNK tokens a step (each row is a float32 row
of the vocabulary, so a long prompt must not take a whole step budget in one go).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pagoda_runtime.engine.outputs import TokenLogprobs
from pagoda_runtime.engine.sequence import Sequence
from pagoda_runtime.executor.host_copy import HostCopy
from pagoda_runtime.executor.sampler import logprob_entry


@dataclass(frozen=True)
class PromptSpan:
    """One sequence's prompt rows in a step: positions first .. first + count - 1."""

    seq_index: int  # in the batch
    first: int
    count: int
    top_k: int


def prompt_spans(
    seqs: list[Sequence], starts: np.ndarray, news: np.ndarray, known: np.ndarray
) -> tuple[list[PromptSpan], np.ndarray, np.ndarray]:
    """The step's prompt rows: the spans, each row's index among the step's tokens, and the prompt
    token each row predicts. Only a sequence computing more than its last known token can have any
    (a decode computes just that one, whose logits sample), so a decode step looks at no sequence."""
    spans, rows, targets = [], [], []
    firsts = None  # each sequence's first token in the step, once needed
    for i in np.flatnonzero(starts < known - 1).tolist():
        seq = seqs[i]
        top_k = seq.params.prompt_logprobs
        first, end = int(starts[i]), min(int(starts[i] + news[i]), seq.num_prompt_tokens - 1)
        if top_k is None or seq.index != 0 or end <= first:
            continue  # a request's other samples compute its prompt again only to fork
        if firsts is None:
            firsts = np.cumsum(news) - news
        spans.append(PromptSpan(i, first, end - first, top_k))
        rows.append(np.arange(end - first, dtype=np.int64) + int(firsts[i]))
        targets.append(np.asarray(seq.token_ids[first + 1 : end + 1], dtype=np.int64))
    if not spans:
        return [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return spans, np.concatenate(rows), np.concatenate(targets)


class DevicePromptLogprobs:
    """A step's prompt logprobs, computed on the device and on their way to the host."""

    def __init__(self, spans: list[PromptSpan], logits: torch.Tensor, targets: torch.Tensor) -> None:
        self.spans = spans
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = logprobs.gather(1, targets[:, None])[:, 0]
        # vLLM's rank: 1 + how many tokens the model found likelier than the prompt's own.
        ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
        top_values, top_ids = logprobs.topk(max(s.top_k for s in spans), dim=-1)
        self._copy = HostCopy([targets, chosen, ranks, top_values, top_ids])

    def to_host(self) -> list[tuple[PromptSpan, list[TokenLogprobs], list[int]]]:
        """Per span, one {token id: logprob} per row (the prompt token's, then its top k) and the
        prompt token's rank per row."""
        targets, chosen, ranks, top_values, top_ids = (t.tolist() for t in self._copy.wait())
        out, row = [], 0
        for span in self.spans:
            rows = range(row, row + span.count)
            entries = [
                logprob_entry(targets[r], chosen[r], top_ids[r], top_values[r], span.top_k) for r in rows
            ]
            out.append((span, entries, ranks[row : row + span.count]))
            row += span.count
        return out
