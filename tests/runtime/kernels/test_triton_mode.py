"""The Triton kernels compile wherever CUDA is visible and run in the interpreter only where it is
not, whatever TRITON_INTERPRET says. Each case is a fresh process, since triton decides at import;
"CUDA visible" is torch.cuda.is_available() answering True, which is all pagoda_runtime asks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pagoda_runtime

RUNTIME = str(Path(pagoda_runtime.__file__).parents[1])
PROBE = """
import os
import torch
{before}
from pagoda_runtime.executor.kernels import triton_paged_attention
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
kernel = triton_paged_attention._paged_attention_kernel
print(isinstance(kernel, InterpretedFunction), isinstance(tl.standard.cdiv, InterpretedFunction),
      os.environ["TRITON_INTERPRET"])
"""


def _probe(triton_interpret: str, cuda_visible: bool, import_triton_first: bool = False):
    before = "torch.cuda.is_available = lambda: True" if cuda_visible else ""
    if import_triton_first:
        before += "\nimport triton"
    env = {**os.environ, "TRITON_INTERPRET": triton_interpret, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([RUNTIME, env.get("PYTHONPATH", "")])
    code = PROBE.format(before=before)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_without_cuda_the_kernels_are_interpreted_even_when_told_to_compile() -> None:
    probe = _probe("0", cuda_visible=False)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["True", "True", "1"]


def test_with_cuda_an_inherited_triton_interpret_is_overruled() -> None:
    probe = _probe("1", cuda_visible=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["False", "False", "0"]
    assert "TRITON_INTERPRET is overruled" in probe.stderr


def test_with_cuda_a_triton_already_imported_for_the_interpreter_is_refused() -> None:
    probe = _probe("1", cuda_visible=True, import_triton_first=True)
    assert probe.returncode != 0
    assert "unset TRITON_INTERPRET" in probe.stderr
