"""What a mixture-of-experts layer adds to softmax routing and SiLU-gated experts (Mixtral's and
Qwen3-MoE's layer): one frozen record the model's layer builds and kernels/moe.py's fused_moe, the
Triton kernels (triton_moe.py) and the reference (moe_reference.py) take whole."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagoda_runtime.executor.kernels.moe_activation import ClampedSwiGLU
from pagoda_runtime.executor.kernels.moe_routing import SigmoidRouting, SoftmaxGroups


@dataclass(frozen=True)
class ExpertOptions:
    # [E, 2 * I] in the model dtype, the gate half then the up half (GPT-OSS).
    gate_up_bias: torch.Tensor | None = None
    # [E, H] in the model dtype; under tensor parallelism one rank passes it, since the all-reduce of
    # the ranks' partial outputs would add it once per rank.
    down_bias: torch.Tensor | None = None
    # None: SiLU(gate) * up; GPT-OSS's clamped SwiGLU otherwise.
    activation: ClampedSwiGLU | None = None
    # DeepSeek V3's and GLM-4.5's grouped sigmoid scores (moe_routing.route); None: softmax.
    sigmoid_routing: SigmoidRouting | None = None
    # [E] float32, added to the sigmoid (or ERNIE 4.5's softmax) scores that choose the experts (not
    # to their weights).
    correction_bias: torch.Tensor | None = None
    # DeepSeek V2's group_limited_greedy softmax routing (moe_routing.route); None: every expert.
    softmax_groups: SoftmaxGroups | None = None
    # Llama 4's rule: the router's weight scales the token's input to its expert (rounded to the
    # activations' dtype, as transformers multiplies them), not the expert's output; top_k 1 only,
    # where one expert sees each token.
    weight_on_input: bool = False


PLAIN = ExpertOptions()


def check_weight_on_input(top_k: int, options: ExpertOptions) -> None:
    """Raises ValueError where the router's weight would scale the input of more than one expert."""
    if options.weight_on_input and top_k != 1:
        raise ValueError(f"the router's weight scales the expert's input only with top_k 1, not {top_k}")
