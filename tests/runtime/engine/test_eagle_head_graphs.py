"""An EAGLE head's CUDA graphs, pretended on the CPU: the head's runner captures its graphs as on a
GPU, each "graph" running its captured forward eagerly on the static buffers when replayed (a CPU
captures none), so that its draft steps (decode graphs) and its catch-up steps (short-step graphs)
take their hidden states from the static buffer and hand theirs back from it, padded as on a GPU.
A trained head then drafts the same tokens as the eager head, and the target's greedy output stays
its own; a catch-up longer than any graph runs eagerly."""

from types import SimpleNamespace

import pytest
from pagoda_runtime import LLM, SamplingParams

from tests.runtime.engine.test_eagle_speculation import (
    TRAINED_PARAMS,
    outputs,
    training_prompts,
    write_head,
)
from tests.runtime.tiny_models import build_tiny_model

K = 3  # the head's short-step graphs take 1 + K tokens a sequence
SIZES = 4  # the most sequences that draft (disable_by_batch_size): graphs of 1, 2 and 4


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny target, the prompts its heads are trained on, its greedy outputs for them, and the
    target alone."""
    root = tmp_path_factory.mktemp("eagle-graphs")
    target = build_tiny_model(root / "target", "llama3", overrides={"num_hidden_layers": 4})
    prompts = training_prompts()
    plain = LLM(str(target), dtype="float32", device="cpu", block_size=4)
    return root, target, prompts, outputs(plain, prompts, TRAINED_PARAMS), plain


def speculating(target, head, method):
    speculative = {
        "method": method,
        "model": str(head),
        "num_speculative_tokens": K,
        "disable_by_batch_size": SIZES,
    }
    return LLM(
        str(target),
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_batched_tokens=16,
        speculative_config=speculative,
    )


def pretend_graphs(runner, speculative) -> None:
    """Capture the head runner's graphs as a GPU would, each replay running the captured forward.
    Each replay starts a fresh step memo in its static attention metadata: the CPU kernels keep
    what they derive from it per step (AttentionMetadata.derived), a GPU's read its buffers."""
    static_meta, metas = runner._static_meta, []

    def meta(size, width):
        metas.append(static_meta(size, width))
        return metas[-1]

    def record(forward):
        derived = metas[-1].derived  # the capture builds each graph's metadata just before

        def replay():
            derived.clear()
            forward()

        return SimpleNamespace(replay=replay)

    runner._static_meta, runner._record = meta, record
    runner._capture_graphs(SIZES, speculative)


def traced(llm) -> tuple[list, list, list]:
    """Record each draft the proposer makes (the tokens per sequence), each forward of the head
    (sequences, most new tokens a sequence, the graph's batch size or None where it ran eagerly),
    and each target step's sequences and drafts."""
    proposer, target = llm.engine.scheduler.proposer, llm.engine.runner
    propose, forward, launch = proposer.propose, proposer._forward, target.launch
    drafts, forwards, steps = [], [], []

    def proposing(seqs, limits):
        proposals = propose(seqs, limits)
        drafts.append([tokens for tokens, _ in proposals])
        return proposals

    def forwarding(batch):
        logits = forward(batch)
        forwards.append((len(batch.seqs), max(batch.num_new_tokens), proposer.runner.last_graph_batch))
        return logits

    def launching(batch, in_flight=None):
        steps.append((len(batch.seqs), len(batch.drafts)))
        return launch(batch, in_flight)

    proposer.propose, proposer._forward, target.launch = proposing, forwarding, launching
    return drafts, forwards, steps


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_a_heads_graph_steps_draft_what_its_eager_steps_do(trained, method):
    root, target, prompts, greedy, plain = trained
    head = write_head(method, target, root / method, (prompts, greedy))
    # Three trained prompts draft while a long one is prefilled beside them, a few tokens a step.
    prompts = [*prompts[:3], prompts[3] * 8]
    params = [TRAINED_PARAMS] * 3 + [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)]
    expected = outputs(plain, prompts, params)
    runs = []
    for graphs in (False, True):
        llm = speculating(target, head, method)
        if graphs:
            pretend_graphs(llm.engine.scheduler.proposer.runner, llm.engine.engine_config.speculative_config)
        drafts, forwards, steps = traced(llm)
        assert outputs(llm, prompts, params) == expected
        counts = llm.engine.stats().spec_decode
        runs.append((drafts, (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens)))
    assert runs[0] == runs[1]
    counts = runs[1][1]
    assert counts[2] / counts[1] > 0.35, counts  # the trained head's drafts are mostly accepted
    assert any(0 < drafted < n for n, drafted in steps), "no step had sequences drafting beside others"
    replayed = [(n, width, size) for n, width, size in forwards if size is not None]
    assert any(width == 1 for _, width, _ in replayed), "no draft step replayed a decode graph"
    assert any(1 < width <= 1 + K for _, width, _ in replayed), "no catch-up replayed a short-step graph"
    assert any(n < size for n, _, size in replayed), "no replay was padded"
    # A prompt's first catch-up is longer than any graph: it ran eagerly.
    assert any(size is None and width > 1 + K for _, width, size in forwards)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_a_trained_heads_graphs_keep_its_drafts_accepted_on_the_gpu(trained, method):
    """On CUDA the head's real graphs: a trained head's drafts are accepted about as often as
    eagerly (--enforce-eager), and the greedy output is the target's."""
    root, target, prompts, greedy, _ = trained
    head = write_head(method, target, root / f"gpu-{method}", (prompts, greedy))
    kwargs = dict(dtype="float32", device="cuda", block_size=16, max_num_seqs=8, kv_cache_memory=2**26)
    expected = outputs(LLM(str(target), **kwargs), prompts[:4], TRAINED_PARAMS)
    config = {"method": method, "model": str(head), "num_speculative_tokens": K}
    rates = []
    for eager in (False, True):
        llm = LLM(str(target), speculative_config=config, enforce_eager=eager, **kwargs)
        runner = llm.engine.scheduler.proposer.runner
        replay, replayed = runner._replay, []

        def recorded(step, replay=replay, replayed=replayed):
            replayed.append(step.meta.max_query_len)
            return replay(step)

        runner._replay = recorded
        assert outputs(llm, prompts[:4], TRAINED_PARAMS) == expected
        # Replayed: the draft steps' decode graphs, and the catch-ups' after accepted drafts.
        assert set(replayed) == (set() if eager else {1, 1 + K}), replayed
        counts = llm.engine.stats().spec_decode
        rates.append(counts.num_accepted_tokens / counts.num_draft_tokens)
    assert min(rates) > 0.35 and abs(rates[0] - rates[1]) < 0.1, rates
