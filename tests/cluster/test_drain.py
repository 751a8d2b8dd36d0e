"""A pod of the operator's Deployment stopped the way the kubelet stops it loses no request.

The kubelet runs the container's preStop hook, then sends SIGTERM, and SIGKILLs whatever is still
running when terminationGracePeriodSeconds (counted from the start of the hook) are up. Here the
container is a real runtime process started with the arguments the operator renders, and the
hook and the grace period are the rendered ones too.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import pytest
from loopback_client import stream_completion
from pagoda_operator.models import InferenceServiceSpec
from pagoda_operator.plan import plan_service
from pagoda_operator.render import RenderOptions, render
from runtime_process import RuntimeProcess

# No control plane here: the rendered pod spec and a real runtime process are all it needs.
pytestmark = pytest.mark.slow

# A busy pod: eight streams generating and two queued behind them when termination begins.
MAX_NUM_SEQS = 8
STREAMS = 10
# Several seconds of work at batch 8 on two cores, so that every stream is still generating after the
# preStop sleep (2 s): 96 tokens took about 3.5 s here, too close to it for a faster machine.
MAX_TOKENS = 256
SPEC = {
    "model": {"source": "bundled://smollm2-135m", "family": "smollm2-135m", "maxModelLen": 1024},
    "runtime": {"maxNumSeqs": MAX_NUM_SEQS, "maxNumBatchedTokens": 1024, "kvCacheMemory": 200 * 2**20},
    "variants": [{"name": "cpu"}],
    "resources": {"gpus": 0, "cpu": "2", "memory": "3Gi"},
    "drain": {"timeoutSeconds": 120, "endpointRemovalSeconds": 2},
}


def _pod_spec() -> dict:
    spec = InferenceServiceSpec.model_validate(SPEC)
    objects = render(plan_service(spec), namespace="default", name="smol", uid="0", options=RenderOptions())
    return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]


def _run_pre_stop(hook: dict, url: str, late: dict) -> threading.Thread:
    """The kubelet's preStop; the rendered hook is a sleep, and the pod must keep serving meanwhile.

    Endpoints still route here until their controllers catch up, so a request arriving now (its
    outcome recorded in late) must be accepted like any other, not refused.
    """
    assert set(hook) == {"sleep"}, f"the test knows how to run a sleep hook, not {hook}"
    ends = time.monotonic() + hook["sleep"]["seconds"]
    thread = threading.Thread(target=stream_completion, args=(url, MAX_TOKENS, late))
    thread.start()
    time.sleep(max(0.0, ends - time.monotonic()))
    return thread


def _wait_busy(runtime: RuntimeProcess, timeout: float = 120.0) -> None:
    """Until every stream is in the engine and the ones beyond max-num-seqs queue behind the rest."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = runtime.metric("pagoda_num_requests_running")
        waiting = runtime.metric("pagoda_num_requests_waiting")
        # The readiness canary may hold a batch slot for a moment, queueing one more stream.
        if running + waiting == STREAMS and waiting >= STREAMS - MAX_NUM_SEQS:
            return
        time.sleep(0.05)
    raise AssertionError(f"the streams never all reached the engine: {running} running, {waiting} waiting")


def _wait_unready(url: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = httpx.get(url + "/health/ready", timeout=5)
        if ready.status_code == 503:
            return ready.json()
        time.sleep(0.05)
    raise AssertionError(f"/health/ready still answered 200 {timeout:g}s after SIGTERM")


def test_prestop_then_sigterm_completes_every_stream_and_exits_within_the_grace_period(tmp_path):
    pod = _pod_spec()
    container = pod["containers"][0]
    grace = pod["terminationGracePeriodSeconds"]
    runtime = RuntimeProcess(container, tmp_path)
    try:
        runtime.wait_ready()
        records = [{} for _ in range(STREAMS)]
        threads = [
            threading.Thread(target=stream_completion, args=(runtime.url, MAX_TOKENS, record))
            for record in records
        ]
        for thread in threads:
            thread.start()
        _wait_busy(runtime)

        terminating_at = time.monotonic()
        late = {}
        threads.append(_run_pre_stop(container["lifecycle"]["preStop"], runtime.url, late))
        records.append(late)
        assert not any(r.get("done") for r in records), "streams must still be in flight at SIGTERM"
        runtime.process.send_signal(signal.SIGTERM)

        ready = _wait_unready(runtime.url)
        assert ready["checks"]["not_draining"]["ok"] is False
        # A draining pod is still alive: the kubelet must not restart it mid-drain.
        assert httpx.get(runtime.url + "/health/live", timeout=5).status_code == 200
        for path, body in (
            ("/v1/completions", {"prompt": "x", "max_tokens": 2}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}),
        ):
            refused = httpx.post(runtime.url + path, json=body, timeout=10)
            assert refused.status_code == 503, (path, refused.status_code, refused.text)
            assert int(refused.headers["retry-after"]) > 0
            assert refused.json()["error"]["code"] == "draining"

        try:
            exit_code = runtime.process.wait(grace - (time.monotonic() - terminating_at))
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {grace}s after termination began: the kubelet would SIGKILL it")
        assert exit_code == 0, runtime.log()[-3000:]
        for thread in threads:
            thread.join(10)
        for record in records:
            assert record["error"] is None and record["status"] == 200, record
            assert record["done"] and record["finish_reasons"] == ["length"], record
            assert record["usage"]["completion_tokens"] == MAX_TOKENS, record
        summary = f"{len(records)} in-flight requests completed, 0 aborted"
        assert summary in runtime.log(), runtime.log()[-3000:]
    finally:
        runtime.stop()
