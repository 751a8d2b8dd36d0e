"""One request's state in the engine, and what each sampled token does to it.

`Request` holds the request's sequences (one per sample), their detokenizers and logprobs, and
its timings. A sampled token is applied in two halves, so that the engine can make text while
the device runs the next step: `append_token` adds it and applies the stop rules that need no
text (stop token ids, EOS, a completed grammar, max_tokens, the context length), `append_text`
makes its text delta and matches stop strings. They decide that a sequence stops and leave
freeing its blocks to the engine. `output` assembles the RequestOutput.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from pagoda_runtime.contract.pooling import PoolingParams
from pagoda_runtime.engine.detokenizer import IncrementalDetokenizer
from pagoda_runtime.engine.grammar_mask import advance
from pagoda_runtime.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup
from pagoda_runtime.engine.tokenizer import Tokenizer


@dataclass(frozen=True)
class SampledToken:
    """One token appended to a sequence, its text not yet made."""

    request: Request
    seq: Sequence
    token: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None  # what the rules without text decided
    is_stop_token: bool = False  # a stop token id or EOS: it ends the sample and is not text


class Request:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        arrival_time: float,
        max_model_len: int | None = None,
        internal: bool = False,
        grammars: list | None = None,
        priority: int = 0,
        pooling: PoolingParams | None = None,
    ) -> None:
        """grammars: one llguidance matcher per sample of a constrained request (grammar_mask.py);
        pooling: what an embedding request asked of its embedding (`params` then runs its prompt)."""
        self.prompt = prompt
        self.pooling = pooling
        # The server's own readiness canaries: served like any request, but not counted in the
        # load metrics that autoscaling and users read.
        self.internal = internal
        self.group = SequenceGroup(request_id, prompt_token_ids, params, arrival_time, priority=priority)
        self.group.seqs = [Sequence(self.group, i, max_model_len) for i in range(params.n)]
        for seq, grammar in zip(self.group.seqs, grammars or (), strict=False):
            seq.grammar = grammar
        self.detokenizers = [
            IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
            )
            for _ in range(params.n)
        ]
        self.logprobs: list[list[TokenLogprobs] | None] = [
            [] if params.logprobs is not None else None for _ in range(params.n)
        ]
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None
        self.prompt_token_ranks: list[int | None] | None = None
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = [None] * len(prompt_token_ids)
            self.prompt_token_ranks = [None] * len(prompt_token_ids)
        self.metrics = RequestMetrics(arrival_time=arrival_time)

    @property
    def request_id(self) -> str:
        return self.group.request_id

    @property
    def seqs(self) -> list[Sequence]:
        return self.group.seqs

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    def append_token(
        self,
        seq: Sequence,
        token: int,
        logprobs: TokenLogprobs | None,
        eos_token_ids: Seq[int],
    ) -> SampledToken:
        """Add one sampled token, read from the device, to `seq` and apply the stop rules that need
        no text: what the scheduler must know before it plans the step after the next."""
        params = seq.params
        seq.append_read_token(token)
        if logprobs is not None:
            self.logprobs[seq.index].append(logprobs)
        grammar_done = advance(seq, token)
        if token in params.stop_token_ids:
            seq.stop_reason = token
            return SampledToken(self, seq, token, logprobs, "stop", is_stop_token=True)
        if not params.ignore_eos and token in eos_token_ids:
            return SampledToken(self, seq, token, logprobs, "stop", is_stop_token=True)
        reason = None
        if grammar_done:
            reason = "stop"
        elif seq.last_token_read:
            reason = "length"
        return SampledToken(self, seq, token, logprobs, reason)

    def drop_tokens(self, seq: Sequence, count: int) -> None:
        """Take back the last `count` tokens appended to a finished sequence: those a verify step
        emitted after the token whose stop string ended it."""
        del seq.token_ids[-count:]
        if self.logprobs[seq.index] is not None:
            del self.logprobs[seq.index][-count:]

    def append_text(self, sampled: SampledToken) -> CompletionOutput:
        """The token's text delta, and its stop string if it completed one: a stop string
        outranks a grammar's end and the length limit in the returned finish_reason."""
        seq, params = sampled.seq, sampled.seq.params
        detokenizer = self.detokenizers[seq.index]
        text = ""
        reason = sampled.finish_reason
        if not sampled.is_stop_token and params.detokenize:
            delta = detokenizer.add_tokens([sampled.token])
            text = delta.text
            if delta.stop is not None:
                reason, seq.stop_reason = "stop", delta.stop
        if reason is not None and params.detokenize:
            text += detokenizer.finish()
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=[sampled.token],
            logprobs=None if sampled.logprobs is None else [sampled.logprobs],
            finish_reason=reason,
            stop_reason=seq.stop_reason if reason is not None else None,
        )

    def record_prompt_logprobs(self, first: int, entries: list[TokenLogprobs], ranks: list[int]) -> None:
        """The logprobs and ranks of prompt tokens first + 1 .. first + len(entries), from the
        logits after the tokens before each (a prompt computed again after a preemption gives the
        same)."""
        self.prompt_logprobs[first + 1 : first + 1 + len(entries)] = entries
        self.prompt_token_ranks[first + 1 : first + 1 + len(ranks)] = ranks

    def output(self, deltas: list[CompletionOutput]) -> RequestOutput:
        finished = self.finished
        outputs = []
        if finished or self.group.params.output_kind == "cumulative":
            outputs = self._cumulative()
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.group.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            metrics=self.metrics,
            num_cached_tokens=self.seqs[0].num_cached_tokens,
            delta=deltas,
            prompt_logprobs=None if self.prompt_logprobs is None else list(self.prompt_logprobs),
            prompt_token_ranks=None if self.prompt_token_ranks is None else list(self.prompt_token_ranks),
        )

    def _cumulative(self) -> list[CompletionOutput]:
        return [
            CompletionOutput(
                index=seq.index,
                text=self.detokenizers[seq.index].output_text,
                token_ids=seq.output_token_ids,  # a new list: the sequence's own goes on growing
                logprobs=None if self.logprobs[seq.index] is None else list(self.logprobs[seq.index]),
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
            )
            for seq in self.seqs
        ]
