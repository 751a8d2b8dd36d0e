"""The GPU check's steps and its one results file; scripts/gpu-check.sh prepares the packages and runs it.

Steps, each recorded in OUT/gpu-check.json with what it saw:
- environment: versions, the GPU, and that the Triton kernels compile (not interpreted);
- tests: every `gpu` test under tests/runtime, then the kernel tests, which run on the GPU with the
  kernels compiled (the greedy-parity, CUDA-graph, fp8, long-context, recompilation, memory and
  quantization-variant checks are `gpu` tests);
- serve: the bundled model served on the GPU, driven with the official openai client: a chat, the
  same chat streamed (greedy, so the text must match), n > 1 samples, and a burst of concurrent
  requests that must all complete.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def _environment() -> dict:
    import torch
    import transformers
    import triton
    from pagoda_runtime.executor import triton_mode

    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
        "triton_interpreted": triton_mode.INTERPRETED,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
        )
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    return env


def _junit_summary(path: Path) -> dict:
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = []
    for case in suite.iter("testcase"):
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()
            failed.append({"test": f"{case.get('classname')}::{case.get('name')}", "message": message[:1]})
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {**counts, "seconds": float(suite.get("time", 0)), "failed": failed}


def _pytest(name: str, args: list[str], out: Path) -> dict:
    junit = out / f"{name}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]
    with (out / f"{name}.log").open("w") as log:
        code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    result = {"command": shlex.join(command[1:]), "exit_code": code}
    if junit.exists():
        result.update(_junit_summary(junit))
    # 5: nothing collected, which for a named selection is a failure of the check too.
    result["ok"] = code == 0
    return result


def run_tests(out: Path, extra: list[str]) -> dict:
    gpu = _pytest("gpu-tests", ["tests/runtime", "-m", "gpu", *extra], out)
    kernels = _pytest(
        "kernel-tests",
        [
            "tests/runtime/kernels",
            "tests/runtime/quantization/test_triton_kernels.py",
            "-m",
            "not gpu",
            *extra,
        ],
        out,
    )
    return {"ok": gpu["ok"] and kernels["ok"], "gpu": gpu, "kernels": kernels}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, process: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health/ready", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {timeout:.0f} s")


def _check(results: dict, name: str, fn) -> None:
    started = time.perf_counter()
    try:
        results[name] = {"ok": True, **fn()}
    except Exception as error:  # every check reports, whatever the one before it did
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    results[name]["seconds"] = round(time.perf_counter() - started, 3)


def _chat_checks(url: str, burst: int) -> dict:
    import httpx
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    results: dict = {"info": httpx.get(url + "/v1/info", timeout=10).json()}

    def chat():
        whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=32, temperature=0)
        text = whole.choices[0].message.content
        assert text, "the chat answer is empty"
        results["_greedy"] = text
        return {"text": text, "usage": whole.usage.model_dump()}

    def streaming():
        stream = client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=32, temperature=0, stream=True
        )
        text = "".join(c.delta.content or "" for chunk in stream for c in chunk.choices)
        assert text == results.get("_greedy"), f"streamed {text!r} differs from the whole answer"
        return {"text": text}

    def samples():
        result = client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=16, n=4, temperature=1.0, seed=1
        )
        indices = sorted(c.index for c in result.choices)
        assert indices == [0, 1, 2, 3], f"choices {indices}"
        assert all(c.message.content for c in result.choices), "an empty sample"
        return {"distinct": len({c.message.content for c in result.choices})}

    async def _burst():
        async with openai.AsyncOpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600
        ) as aclient:
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(
                    aclient.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Count from {i} to {i + 20}."}],
                        max_tokens=64,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    for i in range(burst)
                )
            )
            seconds = time.perf_counter() - started
        tokens = sum(a.usage.completion_tokens for a in answers)
        assert tokens == 64 * burst, f"{tokens} tokens for {burst} requests of 64"
        return {
            "requests": burst,
            "completion_tokens": tokens,
            "wall_s": seconds,
            "tok_per_s": tokens / seconds,
        }

    _check(results, "chat", chat)
    _check(results, "streaming", streaming)
    _check(results, "n_samples", samples)
    _check(results, "burst", lambda: asyncio.run(_burst()))
    results.pop("_greedy", None)
    return results


def run_serve(out: Path, burst: int) -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "pagoda_runtime.cli", "serve", "--model", MODEL, "--device", "cuda"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(burst)]
    log_path = out / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = time.perf_counter()
            _wait_ready(url, process, timeout=600)
            result = {"command": shlex.join(command[1:]), "ready_s": round(time.perf_counter() - started, 1)}
            result.update(_chat_checks(url, burst))
        except Exception as error:
            return {"ok": False, "error": f"{type(error).__name__}: {error}", "log_tail": _tail(log_path)}
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(60)
            if process.poll() is None:
                process.kill()
    checks = [v for v in result.values() if isinstance(v, dict) and "ok" in v]
    result["ok"] = all(c["ok"] for c in checks)
    return result


def _tail(path: Path, lines: int = 40) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("PAGODA_GPU_CHECK_OUT", "out/gpu-check"))
    )
    parser.add_argument("--skip", action="append", default=[], choices=["tests", "serve"])
    parser.add_argument("--burst", type=int, default=64, help="concurrent requests in the burst (default 64)")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one shell-quoted string")
    args = parser.parse_args(argv)
    if args.burst < 1:
        parser.error("--burst must be at least 1")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["scripts/gpu-check.sh", *(argv if argv is not None else sys.argv[1:])]),
        "steps": {},
    }
    try:
        env = results["environment"] = _environment()
    except ImportError as error:
        env = {"cuda_available": False}
        results["error"] = f"{error}: run the GPU check with a python3 holding torch, triton, transformers"
    if not env["cuda_available"] or env["triton_interpreted"]:
        results.setdefault("error", "torch sees no CUDA GPU here; run the GPU check on a machine with one")
        results["ok"] = False
    else:
        if "tests" not in args.skip:
            results["steps"]["tests"] = run_tests(out, shlex.split(args.pytest_args))
        if "serve" not in args.skip:
            results["steps"]["serve"] = run_serve(out, args.burst)
        results["ok"] = all(step["ok"] for step in results["steps"].values())
    results["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    path = out / "gpu-check.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"gpu-check: {'passed' if results['ok'] else 'FAILED'}; results in {path}", file=sys.stderr)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
