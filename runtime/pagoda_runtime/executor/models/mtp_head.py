"""A checkpoint's multi-token-prediction (MTP) layer as a draft head: speculative decoding's mtp method.

DeepSeek V3 (and R1) and GLM-4.5 checkpoints hold num_nextn_predict_layers layers after their
decoder layers, numbered on from them (model.layers.61.* in DeepSeek-V3), trained with the model to
predict the token after next. As DeepSeek's paper and vLLM run one: at position p the layer takes
token p + 1 and the model's hidden state at p (its final norm's output), normed apart (`enorm`,
`hnorm`, the embedding zero at position 0) and projected together by `eh_proj`; a decoder layer of
the model's own family (latent attention and a mixture of experts for DeepSeek) runs on that, and
its own final norm and LM head (`shared_head.norm`, `shared_head.head`) give the logits of token
p + 2. The stream before that norm is the hidden state the next draft position takes in place of
the model's, so the one layer drafts every position of a longer draft (vLLM does the same). The
embedding is the model's: the MTP module is trained sharing it, and the copy the checkpoint stores
under the layer is not read, which saves its memory (vocabulary x hidden, 0.9B numbers for V3).

The head is the target family's model class with one layer (`mtp_head` subclasses it), so that the
layer is built, split over tensor-parallel ranks, quantized and loaded as the family's own layers
are: the tensors under model.layers.<L>. load as layer 0's. It runs in a ModelRunner of its own with
an EAGLE head's interface (`inputs`, `outputs`, `target_layers`, `project`), drafted by
engine/eagle_proposer.py. A checkpoint with more than one MTP layer drafts with its first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch
from torch import nn

from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.sizing import mtp_layer_architecture
from pagoda_runtime.contract.weight_layout import layer_prefix
from pagoda_runtime.executor.kernels import AttentionOps
from pagoda_runtime.executor.models.decoder import CausalLM, Weight
from pagoda_runtime.executor.models.registry import Shapes, weight_shapes
from pagoda_runtime.executor.quantization import PackedWeight, dequantize, make_linear
from pagoda_runtime.executor.vocab_parallel import VocabParallel
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS, TensorParallel

# The layer's own tensors beside its decoder layer's, under model.layers.<L>., and the names the
# head holds them under (the final norm and LM head where a model's are).
_OWN = {
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "shared_head.norm.weight": "norm.weight",
    "shared_head.head.weight": "lm_head.weight",
}


def mtp_config(config: ModelConfig) -> ModelConfig:
    """The head's config: the model's, one layer of its shape (sizing.mtp_layer_architecture)."""
    return replace(config, architecture=mtp_layer_architecture(config.architecture))


def mtp_weight_shapes(config: ModelConfig) -> Shapes:
    """The tensors of the checkpoint's first MTP layer, by Hugging Face name, with their shapes:
    a decoder layer's, numbered after the model's last, and the layer's own (_OWN)."""
    arch = config.architecture
    first = arch.num_hidden_layers
    longer = replace(
        arch,
        num_hidden_layers=first + 1,
        layer_types=arch.layer_types + arch.layer_types[-1:],
        num_nextn_predict_layers=0,
    )
    prefix = layer_prefix(first)
    shapes = {
        name: shape
        for name, shape in weight_shapes(replace(config, architecture=longer)).items()
        if name.startswith(prefix)
    }
    hidden = arch.hidden_size
    own = {
        "enorm.weight": (hidden,),
        "hnorm.weight": (hidden,),
        "eh_proj.weight": (hidden, 2 * hidden),
        "shared_head.norm.weight": (hidden,),
        "shared_head.head.weight": (arch.vocab_size, hidden),
    }
    return shapes | {prefix + name: shape for name, shape in own.items()}


class MtpHead:
    """Mixed in before a family's CausalLM class by `mtp_head`; see the module's docstring."""

    def __init__(
        self,
        target: CausalLM,
        config: ModelConfig,
        ops: AttentionOps,
        max_position: int,
        quantization: str,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel,
    ) -> None:
        """`target`: the model whose MTP layer this is, whose embedding the head borrows (held as a
        function, so that its weights are not the head's); `config`: mtp_config of the model's."""
        nn.Module.__init__(self)
        self.config, self.tp = config, tp
        self.source = target.config
        arch = config.architecture
        hidden = arch.hidden_size
        self._target_embed = target.embed
        # Not a submodule: the target's weights are not the head's.
        object.__setattr__(self, "_target_embedding", target.embed_tokens)
        self.target_layers = (target.config.architecture.num_hidden_layers,)
        self.layers = nn.ModuleList([self.make_layer(0, ops, quantization, device, dtype)])
        self.enorm = self.make_norm(hidden, device, dtype)
        self.hnorm = self.make_norm(hidden, device, dtype)
        # Whole on every rank in 16 bits, as vLLM holds it: 2 x hidden^2, a few percent of the layer.
        self.eh_proj = make_linear(2 * hidden, hidden, False, "none", device, dtype)
        self.norm = self.make_norm(hidden, device, dtype)
        self.lm_head = VocabParallel(arch.vocab_size, hidden, tp, device, dtype)
        self.requires_grad_(False)
        self.register_rotary_tables(max_position, device, dtype)
        self.inputs: torch.Tensor | None = None  # [tokens, hidden]: each token's hidden state in
        self.outputs: torch.Tensor | None = None  # [tokens, hidden]: the one the next position takes

    @property
    def embed_tokens(self) -> VocabParallel:
        return self._target_embedding

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The model's hidden states as the head takes them: as they are (eh_proj runs per step)."""
        return features

    def forward(self, input_ids, positions, kv_caches, meta) -> torch.Tensor:
        embedded = self._target_embed(input_ids)
        # As vLLM: position 0 has no token before it whose state the layer was trained to read.
        embedded = embedded.masked_fill((positions == 0)[:, None], 0)
        hidden = self.inputs.to(embedded.dtype)
        x = self.eh_proj(torch.cat([self.enorm(embedded)[0], self.hnorm(hidden)[0]], dim=-1))
        x, residual = self.layers[0](positions, x, None, kv_caches[0], meta, self.rotary_table(0))
        normed, self.outputs = self.norm(x, residual)
        return normed

    def pack_for_cpu(self, vocab_dtype: torch.dtype) -> None:
        for module in self._packable():
            module.pack_for_cpu()
        self.lm_head.hold_in(vocab_dtype, lookups=False, logits=True)

    def checkpoint_shapes(self) -> Shapes:
        return dict(_renamed(mtp_weight_shapes(self.source).items(), self.source))

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> None:
        """The checkpoint's MTP tensors (mtp_weight_shapes' names), as the family loads a layer."""
        super().load_weights(_renamed(weights, self.source))

    def _load_tensor(self, hf_name: str, name: str, tensor: Weight, fused: dict, params: dict) -> None:
        if name == "eh_proj.weight":
            self.eh_proj.load(dequantize(tensor) if isinstance(tensor, PackedWeight) else tensor, 0)
            return
        super()._load_tensor(hf_name, name, tensor, fused, params)


def _renamed(items: Iterable[tuple[str, object]], source: ModelConfig) -> Iterator[tuple[str, object]]:
    """The MTP layer's names as the one-layer head holds them: its decoder layer's as layer 0's."""
    prefix = layer_prefix(source.architecture.num_hidden_layers)
    for name, value in items:
        rest = name.removeprefix(prefix)
        yield _OWN.get(rest, layer_prefix(0) + rest), value


def mtp_head(
    target: CausalLM,
    config: ModelConfig,
    ops: AttentionOps,
    max_position: int,
    quantization: str = "none",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    tp: TensorParallel = SINGLE_PROCESS,
) -> CausalLM:
    """The MTP head of `target` (ModelRunner's build, with `target` bound): the target family's
    model class with MtpHead's differences; `config` is mtp_config of the target's."""
    family = type(target)
    head_class = type(f"{family.__name__}MTP", (MtpHead, family), {})
    return head_class(target, config, ops, max_position, quantization, torch.device(device), dtype, tp)
