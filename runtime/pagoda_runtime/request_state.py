"""One request's state in the engine, and what each sampled token does to it.

`Request` holds the request's sequences (one per sample), their detokenizers and logprobs, and
its timings. `append` applies one sampled token: the stop rules (stop token ids, EOS, stop
strings, a completed grammar, max_tokens, the context length) and the text delta; it decides
that a sequence stops and leaves freeing its blocks to the engine. `output` assembles the
cumulative RequestOutput.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from pagoda_runtime.detokenizer import IncrementalDetokenizer
from pagoda_runtime.grammar_mask import advance
from pagoda_runtime.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from pagoda_runtime.sampling_params import SamplingParams
from pagoda_runtime.sequence import Sequence, SequenceGroup
from pagoda_runtime.tokenizer import Tokenizer


class Request:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        arrival_time: float,
        internal: bool = False,
        grammars: list | None = None,
    ) -> None:
        """grammars: one llguidance matcher per sample of a constrained request (grammar_mask.py)."""
        self.prompt = prompt
        # The server's own readiness canaries: served like any request, but not counted in the
        # load metrics that autoscaling and users read.
        self.internal = internal
        self.group = SequenceGroup(request_id, prompt_token_ids, params, arrival_time)
        self.group.seqs = [Sequence(self.group, i) for i in range(params.n)]
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

    def append(
        self,
        seq: Sequence,
        token: int,
        logprobs: TokenLogprobs | None,
        eos_token_ids: Seq[int],
        max_model_len: int,
    ) -> CompletionOutput:
        """Add one sampled token to `seq`; the delta's finish_reason says whether it stops now."""
        params = seq.params
        seq.token_ids.append(token)
        if logprobs is not None:
            self.logprobs[seq.index].append(logprobs)
        detokenizer = self.detokenizers[seq.index]
        text = ""
        grammar_done = advance(seq, token)
        reason: str | None = None
        stop_reason: int | str | None = None
        if token in params.stop_token_ids:
            reason, stop_reason = "stop", token
        elif not params.ignore_eos and token in eos_token_ids:
            reason = "stop"
        else:
            if params.detokenize:
                delta = detokenizer.add_tokens([token])
                text = delta.text
                if delta.stop is not None:
                    reason, stop_reason = "stop", delta.stop
            if reason is None and grammar_done:
                reason = "stop"
            if reason is None and (
                seq.num_output_tokens == params.max_tokens or seq.num_tokens >= max_model_len
            ):
                reason = "length"
        if reason is not None:
            seq.stop_reason = stop_reason
            if params.detokenize:
                text += detokenizer.finish()
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=[token],
            logprobs=None if logprobs is None else [logprobs],
            finish_reason=reason,
            stop_reason=stop_reason,
        )

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
