"""Every Triton kernel launch the runtime makes compiles for a Hopper GPU (sm_90) down to a cubin,
checked on this machine, GPU or not (benchmarks/hopper_compile.py): the interpreter that runs the other
kernel tests on a CPU accepts shapes the compiler rejects, such as a tl.dot over fewer than 16."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pagoda_runtime

REPO = Path(__file__).parents[3]
NO_SPILLS = {
    "_moe_gemm_kernel",
    "_route_kernel",
    "_align_kernel",
    "_lora_shrink_kernel",
    "_lora_expand_kernel",
}


def test_every_kernel_launch_compiles_for_sm_90() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    runtime = str(Path(pagoda_runtime.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join([runtime, str(REPO), env.get("PYTHONPATH", "")])
    script = REPO / "benchmarks" / "hopper_compile.py"
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["failed"] == {}
    assert {name.split(" ")[0] for name in result["compiled"]} == set(result["kernels"])
    # Registers suffice: no launch of these kernels spills to local memory.
    spilled = {
        name: usage
        for name, usage in result["resources"].items()
        if name.split(" ")[0] in NO_SPILLS and (usage["stack"] or usage["local"])
    }
    assert spilled == {}
    # Every launch's shared memory fits what one program may take on Hopper (227 KB), which the
    # compiler does not check: a wider tile would compile and fail at launch (latent attention's
    # 576-wide heads before their tiles were narrowed).
    too_large = {
        name: usage["shared"]
        for name, usage in result["resources"].items()
        if usage["shared"] > result["shared_per_program"]
    }
    assert too_large == {}
