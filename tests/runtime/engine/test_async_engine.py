"""The asyncio front: streamed deltas add up to the final output; aborts and cancellations free blocks;
a step that raises fails only its own requests, and only a broken device stops the loop."""

import asyncio

import pytest
import torch
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.engine.async_engine import AsyncLLMEngine
from pagoda_runtime.engine.protocol import RequestFailed, RequestRejected, ServingEngine
from pagoda_runtime.engine.sampling_params import SamplingParams

from tests.runtime.tiny_models import build_tiny_model


@pytest.fixture(scope="module", params=[False, True], ids=["in-order", "async-scheduling"])
def engine_config(tmp_path_factory, request):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama3", "llama3")
    return EngineConfig(
        model=str(folder), dtype="float32", device="cpu", block_size=4, async_scheduling=request.param
    )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_stream_deltas_add_up_and_abort_ends_a_stream(engine_config):
    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        await engine.start()
        params = SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=20, ignore_eos=True)
        text, tokens, last = ["", ""], [[], []], None
        async for out in engine.generate("Hello, world!", params, "s"):
            for delta in out.delta:
                text[delta.index] += delta.text
                tokens[delta.index] += delta.token_ids
            last = out
        assert last.finished and [o.text for o in last.outputs] == text
        assert [o.token_ids for o in last.outputs] == tokens and all(len(t) == 20 for t in tokens)

        long = SamplingParams(max_tokens=200, ignore_eos=True)
        reasons = []

        async def consume():
            async for out in engine.generate("Once upon a time", long, "a"):
                if out.finished:
                    reasons.extend(o.finish_reason for o in out.outputs)

        task = asyncio.create_task(consume())
        while engine.stats().num_running == 0:
            await asyncio.sleep(0.01)
        await engine.abort("a")
        await task
        assert reasons == ["abort"]
        assert engine.stats().kv_cache_usage == 0.0
        await engine.shutdown()

    run(main())


def test_cancelled_consumer_aborts_its_request_and_the_loop_stays_responsive(engine_config):
    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        await engine.start()

        async def consume():
            async for _ in engine.generate("The quick", SamplingParams(max_tokens=300, ignore_eos=True), "c"):
                pass

        task = asyncio.create_task(consume())
        while engine.stats().num_running == 0:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if engine.stats().kv_cache_usage == 0.0 and engine.stats().num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.stats().kv_cache_usage == 0.0 and not engine.engine.has_unfinished()
        beat = engine.last_heartbeat
        await asyncio.sleep(0.7)
        assert engine.last_heartbeat > beat  # the idle loop still ticks
        assert engine.errored is None
        await engine.shutdown()

    run(main())


def test_a_request_that_cannot_fit_raises_before_streaming(engine_config):
    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        assert isinstance(engine, ServingEngine)
        await engine.start()
        with pytest.raises(ValueError, match="max_model_len") as refused:
            async for _ in engine.generate([5] * 10, SamplingParams(max_tokens=engine.max_model_len), "x"):
                pass
        assert isinstance(refused.value, RequestRejected)
        assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "max_tokens")
        engine.abort_all()
        await engine.shutdown()

    run(main())


def fail_steps_running(engine: AsyncLLMEngine, request_id: str, error: Exception) -> None:
    """Make every step that runs `request_id` raise `error` before it computes anything."""
    launch = engine.engine.runner.launch

    def launch_or_fail(batch, in_flight=None):
        if any(seq.group.request_id == request_id for seq in batch.seqs):
            raise error
        return launch(batch, in_flight)

    engine.engine.runner.launch = launch_or_fail


async def final_text(engine: AsyncLLMEngine, prompt: str, request_id: str, max_tokens: int = 6) -> str:
    last = None
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async for out in engine.generate(prompt, params, request_id):
        last = out
    return last.outputs[0].text


def test_a_failing_step_fails_its_requests_and_the_engine_serves_on(engine_config):
    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        await engine.start()
        expected = await final_text(engine, "Once upon a time", "before")
        fail_steps_running(engine, "bad", IndexError("index 70000 is out of bounds for dimension 1"))
        with pytest.raises(RequestFailed, match="a step that ran this request failed: index 70000"):
            await final_text(engine, "Hello", "bad")
        assert engine.errored is None and engine.stats().num_failed_steps == 1
        assert engine.stats().kv_cache_usage == 0.0 and not engine.engine.has_unfinished()
        # Nothing the failed step left behind changes what the engine computes next.
        assert await final_text(engine, "Once upon a time", "after") == expected
        await engine.shutdown()

    run(main())


def test_a_broken_device_stops_the_loop_and_says_why(engine_config):
    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        await engine.start()
        broken = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
        fail_steps_running(engine, "victim", broken)
        with pytest.raises(RequestFailed, match="the engine stopped after an error: CUDA error"):
            await final_text(engine, "Hello", "victim")
        assert engine.errored is broken and engine.stats().num_failed_steps == 0
        with pytest.raises(RequestFailed, match="illegal memory access"):
            await final_text(engine, "Hello", "later")
        await engine.shutdown()

    run(main())


def test_shutdown_ends_the_loop_when_a_wake_up_races_the_cancellation(engine_config):
    """A request's abort wakes the idle loop just as the server shuts it down (the readiness canary,
    cancelled first, aborts its generation): the loop must end, not tick on and hang the shutdown."""

    async def main():
        engine = AsyncLLMEngine.from_engine_config(engine_config)
        await engine.start()
        for _ in range(20):  # the loop idles in its wait for work
            await asyncio.sleep(0)
        engine._wake.set()
        await asyncio.wait_for(engine.shutdown(), 5)
        assert engine._task.done()

    run(main())
