"""Pagoda's inference runtime: a paged-KV, continuously batching engine and its HTTP server.

The heavy names (LLM, SamplingParams) load lazily so that torch-free modules of this package,
such as `pagoda_runtime.contract.sizing`, can be imported by the operator without pulling in torch.
"""

from typing import TYPE_CHECKING

__all__ = ["LLM", "SamplingParams"]

if TYPE_CHECKING:
    from pagoda_runtime.engine.llm import LLM
    from pagoda_runtime.engine.sampling_params import SamplingParams


def __getattr__(name: str):
    if name == "LLM":
        from pagoda_runtime.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pagoda_runtime.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'pagoda_runtime' has no attribute {name!r}")
