"""How many bytes a model needs: weights per quantization (and what one decode step reads of them),
KV cache per token, and whether it fits.

One function for both halves of Pagoda: the runtime reports these numbers at start-up and the
operator refuses to create pods for a variant that cannot fit. Torch-free on purpose, so that the
operator can import it. With tensor parallelism every figure is per GPU: `ModelArchitecture.per_rank`
is the slice of the model one rank holds, and `check_tensor_parallel` is the rule for which
tensor-parallel sizes a model (and its quantization) can be split into.

Only the linear layers of the decoder blocks are quantized (as in vLLM, AWQ and GPTQ); the
embeddings, the LM head and the norms stay in the model's float dtype (bf16 unless told otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pagoda_runtime.contract.bundled import BUNDLED_FILE, BUNDLED_MODEL_NAME

GIB = 1024**3
# CUDA context, activations of one max-size batch, sampler buffers and CUDA graphs; measured
# footprints of an 8B model beyond weights and KV stay under this.
DEFAULT_OVERHEAD_BYTES = 2 * GIB
# NCCL's buffers for one communicator (NCCL_BUFFSIZE of 4 MiB per channel and peer, for each of its
# protocols) on a node of up to 8 GPUs: an upper estimate, not a measurement (no multi-GPU machine
# was at hand), counted on every GPU of a tensor-parallel group.
NCCL_COMMUNICATOR_BYTES = 512 * 2**20
# Recurrent state slots a hybrid model holds beyond max_num_seqs: one for a scoring pass beside a full
# batch (engine/scoring.py), one that a padded batch's padding sequences write to.
STATE_SLOTS_BEYOND_SEQS = 2
# Layer kinds that keep no keys and values, and those of them that keep a recurrent state instead.
_STATE_LAYERS = ("mamba", "linear_attention", "conv")
_NO_KV_LAYERS = (*_STATE_LAYERS, "mlp")
# The largest tensor-parallel size an error message lists.
LISTED_PARALLEL_SIZES = 64


def dividing_sizes(n: int, up_to: int = LISTED_PARALLEL_SIZES) -> list[int]:
    return [size for size in range(1, min(n, up_to) + 1) if n % size == 0]


def split_evenly(n: int, size: int, what: str) -> int:
    """n // size, or an error naming the tensor-parallel sizes that do divide n."""
    if n % size:
        sizes = ", ".join(map(str, dividing_sizes(n)))
        raise ValueError(
            f"the model's {n} {what} do not split evenly over {size} tensor-parallel ranks; "
            f"use a tensor-parallel size that divides {n}: {sizes}"
        )
    return n // size


def kv_heads_per_rank(num_kv_heads: int, size: int) -> int:
    """KV heads split by rank; with fewer KV heads than ranks each rank holds a copy of the one
    its query heads read (as vLLM does), which needs the size to be a multiple of the head count."""
    if num_kv_heads >= size or size % num_kv_heads:
        return split_evenly(num_kv_heads, size, "key/value heads")
    return 1


def padded_vocab_size(vocab_size: int, size: int) -> int:
    """The vocabulary rounded up to a multiple of the tensor-parallel size (rows past the real
    vocabulary are zeros, and their logits are cut off before sampling)."""
    return -(-vocab_size // size) * size


def _shape_field(description: str, minimum: int | None = None, **kwargs: Any) -> Any:
    """A field of the architecture with the sentence the CRD shows for it (`kubectl explain`) and
    the least value the CRD admits."""
    bound = {} if minimum is None else {"minimum": minimum}
    return field(metadata={"description": description, **bound}, **kwargs)


@dataclass(frozen=True)
class KVCacheShape:
    """One layer's cache of one token: `planes` of `heads` x `head_dim` values. Two planes hold keys
    and values; one plane (multi-head latent attention) holds what is read as both."""

    planes: int
    heads: int
    head_dim: int

    @property
    def numel(self) -> int:
        return self.planes * self.heads * self.head_dim


# The names the fields had in facts written before they took Hugging Face's.
_EARLIER_NAMES = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads"}


@dataclass(frozen=True)
class ModelArchitecture:
    """A model's shape under the names of its Hugging Face config.json: everything sizing reads.

    The one type for it: the runtime's ModelConfig holds one, the model catalogue lists them, a
    download or sizing Job reports one (`from_facts`), and the CRD's `model.architecture` is
    generated from these fields (camelCase; pagoda_operator.models).
    """

    num_hidden_layers: int = _shape_field("Number of decoder layers (num_hidden_layers).", minimum=1)
    hidden_size: int = _shape_field("Width of the residual stream (hidden_size).", minimum=1)
    intermediate_size: int = _shape_field("Width of the MLP (intermediate_size).", minimum=1)
    num_attention_heads: int = _shape_field("Number of query heads.", minimum=1)
    num_key_value_heads: int = _shape_field("Number of key/value heads (grouped-query attention).", minimum=1)
    head_dim: int = _shape_field("Size of one attention head.", minimum=1)
    vocab_size: int = _shape_field("Number of tokens in the vocabulary.", minimum=1)
    max_position_embeddings: int = _shape_field("Longest context the model was trained for.", minimum=1)
    tie_word_embeddings: bool = _shape_field(
        "Whether the LM head shares the input embedding matrix.", default=False
    )
    attention_bias: bool = _shape_field("Whether q, k and v projections have a bias (Qwen2).", default=False)
    sliding_window: int | None = _shape_field(
        "Keys a sliding-window layer attends to, the token itself included (sliding_window); unset: "
        "every layer attends to the whole context.",
        minimum=1,
        default=None,
    )
    layer_types: tuple[
        Literal[
            "full_attention",
            "sliding_attention",
            "chunked_attention",
            "mamba",
            "linear_attention",
            "conv",
            "mlp",
        ],
        ...,
    ] = _shape_field(
        "Each layer's mixer, full_attention, sliding_attention, chunked_attention, mamba (a Mamba-2 "
        "layer of a hybrid model, Granite 4.0-H), linear_attention (a gated DeltaNet layer, Qwen3.5 "
        "and Qwen3-Next) or conv (a gated short convolution, LFM2), or mlp where MLPs are layers of "
        "their own (Nemotron-H: its attention and Mamba layers then hold none) (layer_types); empty: "
        "every layer slides when sliding_window is set (Mistral).",
        default=(),
    )
    attention_chunk_size: int | None = _shape_field(
        "Tokens of each attention chunk of the chunked_attention layers (attention_chunk_size, Llama "
        "4): a token attends to the earlier tokens of its own chunk only.",
        minimum=1,
        default=None,
    )
    num_experts: int = _shape_field(
        "Experts of each mixture-of-experts layer (num_experts, Mixtral's num_local_experts); 0: dense.",
        minimum=0,
        default=0,
    )
    num_experts_per_tok: int = _shape_field("Experts each token is routed to.", minimum=0, default=0)
    moe_intermediate_size: int = _shape_field(
        "Width of each expert's MLP (moe_intermediate_size; Mixtral's intermediate_size).",
        minimum=0,
        default=0,
    )
    shared_expert_intermediate_size: int = _shape_field(
        "Width of the MLP every token of a mixture-of-experts layer also goes through, beside its routed "
        "experts (n_shared_experts times moe_intermediate_size); 0: none.",
        minimum=0,
        default=0,
    )
    shared_expert_gate: bool = _shape_field(
        "Whether a sigmoid of one logit per token (shared_expert_gate) scales the shared experts' "
        "output (Qwen2-MoE).",
        default=False,
    )
    mlp_only_layers: tuple[int, ...] = _shape_field(
        "Layers of a mixture-of-experts model whose MLP is dense, intermediate_size wide.", default=()
    )
    norms_per_layer: int = _shape_field(
        "RMSNorms of hidden_size in each decoder layer: 2 (Llama), 4 (Gemma 2 and 3, before and after "
        "attention and MLP).",
        minimum=1,
        default=2,
    )
    gated_mlp: bool = _shape_field(
        "Whether the dense MLP is gated, down(act(gate(x)) * up(x)), as Llama's and most; false: "
        "down(act(up(x))) without gate_proj (Arcee, Nemotron).",
        default=True,
    )
    norm_bias: bool = _shape_field(
        "Whether each norm holds a bias beside its weight (Nemotron's LayerNorms).", default=False
    )
    activation_parameters: int = _shape_field(
        "Learned numbers of each layer's MLP activation (Apertus' xIELU: 4).", minimum=0, default=0
    )
    qk_norm: bool = _shape_field(
        "Whether each layer normalizes its queries and keys per head (Qwen3, Gemma 3).", default=False
    )
    wide_qk_norm: bool = _shape_field(
        "Whether each layer normalizes its queries and keys over all heads at once (OLMo 2 and 3), "
        "with weights as wide as q and k.",
        default=False,
    )
    attention_sinks: bool = _shape_field(
        "Whether each query head has a learned sink logit that joins its softmax (GPT-OSS).", default=False
    )
    attention_output_bias: bool = _shape_field(
        "Whether the attention output projection has a bias (GPT-OSS; the Llama-layout families whose "
        "attention_bias is set; Seed-OSS's attention_out_bias).",
        default=False,
    )
    expert_bias: bool = _shape_field(
        "Whether the routers and every expert's projections have biases (GPT-OSS).", default=False
    )
    router_score_bias: bool = _shape_field(
        "Whether each router holds a correction bias per expert, added to the scores that choose the "
        "experts (GLM-4.5, DeepSeek V3).",
        default=False,
    )
    q_lora_rank: int = _shape_field(
        "Width of the low-rank query projection of multi-head latent attention (q_lora_rank, "
        "DeepSeek V3); 0: queries projected from the hidden state directly.",
        minimum=0,
        default=0,
    )
    kv_lora_rank: int = _shape_field(
        "Width of the compressed keys and values of multi-head latent attention (kv_lora_rank, "
        "DeepSeek V2 and V3); 0: attention without latents, q, k and v projected per head.",
        minimum=0,
        default=0,
    )
    qk_nope_head_dim: int = _shape_field(
        "Dimensions of each latent-attention head's query and key without rotary embeddings "
        "(qk_nope_head_dim); head_dim is it plus qk_rope_head_dim.",
        minimum=0,
        default=0,
    )
    qk_rope_head_dim: int = _shape_field(
        "Dimensions of each latent-attention head's query and key that are rotated, the key's shared "
        "by all heads (qk_rope_head_dim).",
        minimum=0,
        default=0,
    )
    v_head_dim: int = _shape_field(
        "Dimensions of each latent-attention head's value (v_head_dim).", minimum=0, default=0
    )
    fused_qkv: bool = _shape_field(
        "Whether the checkpoint stores q, k and v as one projection (Phi-3's qkv_proj), which a GGUF "
        "file quantizes as one tensor.",
        default=False,
    )
    mamba_num_heads: int = _shape_field(
        "Heads of each Mamba-2 layer (mamba_n_heads); 0: no layer is a Mamba layer.", minimum=0, default=0
    )
    mamba_head_dim: int = _shape_field("Size of one Mamba-2 head (mamba_d_head).", minimum=0, default=0)
    mamba_state_size: int = _shape_field(
        "Size of each Mamba-2 head's recurrent state per channel (mamba_d_state).", minimum=0, default=0
    )
    mamba_groups: int = _shape_field(
        "Groups of heads sharing the Mamba-2 B and C projections (mamba_n_groups).", minimum=0, default=0
    )
    mamba_conv_kernel: int = _shape_field(
        "Width of the Mamba-2 causal convolution (mamba_d_conv).", minimum=0, default=0
    )
    linear_num_key_heads: int = _shape_field(
        "Key (and query) heads of each gated DeltaNet layer (linear_num_key_heads); 0: no such layer.",
        minimum=0,
        default=0,
    )
    linear_num_value_heads: int = _shape_field(
        "Value heads of each gated DeltaNet layer, each with its recurrent state (linear_num_value_heads).",
        minimum=0,
        default=0,
    )
    linear_key_head_dim: int = _shape_field(
        "Size of a gated DeltaNet key head (linear_key_head_dim).", minimum=0, default=0
    )
    linear_value_head_dim: int = _shape_field(
        "Size of a gated DeltaNet value head (linear_value_head_dim).", minimum=0, default=0
    )
    linear_conv_kernel: int = _shape_field(
        "Width of the gated DeltaNet causal convolution (linear_conv_kernel_dim).", minimum=0, default=0
    )
    short_conv_kernel: int = _shape_field(
        "Width of the gated short convolution of LFM2's conv layers (conv_L_cache); 0: no such layer.",
        minimum=0,
        default=0,
    )
    attention_output_gate: bool = _shape_field(
        "Whether q_proj also gives each query channel a gate whose sigmoid scales the attention's output "
        "before o_proj (Qwen3-Next, Qwen3.5).",
        default=False,
    )
    num_nextn_predict_layers: int = _shape_field(
        "Multi-token-prediction layers the checkpoint holds after its decoder layers "
        "(num_nextn_predict_layers, DeepSeek V3 and GLM-4.5), which speculative decoding's mtp method "
        "drafts with; 0: none.",
        minimum=0,
        default=0,
    )

    def __post_init__(self) -> None:
        # Reports and specs carry JSON lists; the architecture stays hashable (sizing caches by it).
        for name in ("layer_types", "mlp_only_layers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types lists {len(self.layer_types)} layers but the model has {self.num_hidden_layers}"
            )
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError("a model has sliding-window layers or chunked ones, not both")
        if "chunked_attention" in self.layer_types and self.attention_chunk_size is None:
            raise ValueError("layer_types lists chunked_attention layers but attention_chunk_size is unset")
        if ("mamba" in self.layer_types) != (self.mamba_num_heads > 0):
            raise ValueError("layer_types lists mamba layers exactly when mamba_num_heads is set")
        if self.mamba_num_heads and not (
            self.mamba_head_dim and self.mamba_state_size and self.mamba_conv_kernel > 1
        ):
            raise ValueError(
                "a Mamba-2 layer needs mamba_head_dim, mamba_state_size and mamba_conv_kernel > 1"
            )
        if self.mamba_num_heads and (self.mamba_groups < 1 or self.mamba_num_heads % self.mamba_groups):
            raise ValueError(
                f"mamba_groups ({self.mamba_groups}) must divide mamba_num_heads ({self.mamba_num_heads})"
            )
        if self.layer_types and not self.num_attention_layers:
            raise ValueError(
                "no layer attends; Pagoda serves hybrids whose recurrent or MLP layers "
                "sit beside at least one attention layer"
            )
        if ("linear_attention" in self.layer_types) != (self.linear_num_value_heads > 0):
            raise ValueError(
                "layer_types lists linear_attention layers exactly when linear_num_value_heads is set"
            )
        if self.linear_num_value_heads and not (
            self.linear_num_key_heads
            and self.linear_num_value_heads % self.linear_num_key_heads == 0
            and self.linear_key_head_dim
            and self.linear_value_head_dim
            and self.linear_conv_kernel > 1
        ):
            raise ValueError(
                "a gated DeltaNet layer needs key heads dividing its value heads, both head sizes and "
                "linear_conv_kernel > 1"
            )
        if ("conv" in self.layer_types) != (self.short_conv_kernel > 1):
            raise ValueError("layer_types lists conv layers exactly when short_conv_kernel (> 1) is set")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok must be between 1 and num_experts ({self.num_experts}), "
                f"not {self.num_experts_per_tok}"
            )

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> ModelArchitecture:
        """The architecture a Job reported (`asdict` of one); reports written before the fields took
        Hugging Face's names, which cache claims keep in their manifests, read too."""
        return cls(**{_EARLIER_NAMES.get(name, name): value for name, value in facts.items()})

    @property
    def window(self) -> int | None:
        """The most keys a windowed layer attends to: the sliding window, or the attention chunk."""
        return self.sliding_window if self.attention_chunk_size is None else self.attention_chunk_size

    def layer_window(self, layer: int) -> int | None:
        """The most keys layer `layer` attends to (its sliding window, or its attention chunk), None
        where it attends to the whole context (or, a Mamba layer, to none)."""
        if self.window is None:
            return None
        if self.layer_types and self.layer_types[layer] in ("full_attention", *_NO_KV_LAYERS):
            return None
        return self.window

    def is_attention_layer(self, layer: int) -> bool:
        """Whether layer `layer` attends, and so keeps keys and values."""
        return not self.layer_types or self.layer_types[layer] not in _NO_KV_LAYERS

    def is_state_layer(self, layer: int) -> bool:
        """Whether layer `layer` keeps a recurrent state per sequence (a Mamba-2, gated DeltaNet or
        short-convolution layer) instead of keys and values."""
        return bool(self.layer_types) and self.layer_types[layer] in _STATE_LAYERS

    @property
    def num_state_layers(self) -> int:
        return sum(kind in _STATE_LAYERS for kind in self.layer_types)

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(kind == "linear_attention" for kind in self.layer_types)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels a gated DeltaNet convolution runs over: q, k and v."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def linear_state_numel(self) -> int:
        """What one sequence holds in one gated DeltaNet layer: the convolution's last
        linear_conv_kernel - 1 inputs and each value head's key_head_dim x value_head_dim state."""
        if not self.linear_num_value_heads:
            return 0
        conv = self.linear_conv_dim * (self.linear_conv_kernel - 1)
        return conv + self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim

    def state_numel(self, layer: int) -> int:
        """What one sequence holds in layer `layer`'s recurrent state (0: the layer keeps none)."""
        kind = self.layer_types[layer] if self.layer_types else None
        # A short convolution keeps its last kernel - 1 inputs, each hidden_size wide.
        conv = self.hidden_size * (self.short_conv_kernel - 1)
        return {
            "mamba": self.mamba_state_numel,
            "linear_attention": self.linear_state_numel,
            "conv": conv,
        }.get(kind, 0)

    def is_mamba_layer(self, layer: int) -> bool:
        """Whether layer `layer` mixes tokens with a Mamba-2 state rather than attention (no KV)."""
        return bool(self.layer_types) and self.layer_types[layer] == "mamba"

    @property
    def num_mamba_layers(self) -> int:
        return sum(kind == "mamba" for kind in self.layer_types)

    @property
    def num_attention_layers(self) -> int:
        """The layers that keep keys and values."""
        return sum(self.is_attention_layer(i) for i in range(self.num_hidden_layers))

    @property
    def num_dense_mlp_layers(self) -> int:
        """Dense MLPs, intermediate_size wide: one in each layer without experts, or, where MLPs are
        layers of their own, one in each mlp layer."""
        if "mlp" in self.layer_types:
            return self.layer_types.count("mlp")
        return self.num_hidden_layers - self.num_sparse_layers

    @property
    def mamba_intermediate_size(self) -> int:
        """Channels of a Mamba-2 layer: its heads times their size."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels the causal convolution runs over: x, then B and C of every group."""
        return self.mamba_intermediate_size + 2 * self.mamba_groups * self.mamba_state_size

    @property
    def mamba_state_numel(self) -> int:
        """What one sequence holds in one Mamba-2 layer, whatever its length: the convolution's last
        mamba_conv_kernel - 1 inputs and each head's head_dim x state_size recurrent state."""
        if not self.mamba_num_heads:
            return 0
        conv = self.mamba_conv_dim * (self.mamba_conv_kernel - 1)
        return conv + self.mamba_num_heads * self.mamba_head_dim * self.mamba_state_size

    def layer_chunked(self, layer: int) -> bool:
        """Whether layer `layer` attends within its token's chunk (layer_window is then the chunk)."""
        return self.attention_chunk_size is not None and self.layer_window(layer) is not None

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.layer_window(i) is not None for i in range(self.num_hidden_layers))

    def is_sparse_layer(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts."""
        return self.num_experts > 0 and layer not in self.mlp_only_layers

    @property
    def num_sparse_layers(self) -> int:
        return sum(self.is_sparse_layer(i) for i in range(self.num_hidden_layers))

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def attention_head_dim(self) -> int:
        """The width of every head the attention kernels take, query, key and value alike: head_dim;
        for multi-head latent attention, served absorbed, the compressed latent and the rotated key
        (kv_lora_rank + qk_rope_head_dim), which every query head attends to as a key and reads as
        a value."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_dim

    @property
    def kv_cache_shape(self) -> KVCacheShape:
        """What one layer caches per token: keys and values of each KV head; latent attention's one
        latent, read as both key and value, in one plane."""
        if self.kv_lora_rank:
            return KVCacheShape(planes=1, heads=1, head_dim=self.attention_head_dim)
        return KVCacheShape(planes=2, heads=self.num_key_value_heads, head_dim=self.head_dim)

    @property
    def attention_output_size(self) -> int:
        """Inputs of the attention output projection: the heads' values."""
        if self.kv_lora_rank:
            return self.num_attention_heads * self.v_head_dim
        return self.q_size

    def attention_linear_shapes(self) -> list[tuple[int, int, int]]:
        """(out_features, in_features, how many) of every layer's attention projections: q, k, v and
        o; or multi-head latent attention's q (or q_a and q_b), kv_a, kv_b and o, where q_a and
        kv_a are whole on every rank and the others split by heads."""
        q, kv, h, n = self.q_size, self.kv_size, self.hidden_size, self.num_attention_layers
        if not self.kv_lora_rank:
            gated = 2 * q if self.attention_output_gate else q
            return [(gated, h, n), (kv, h, n), (kv, h, n), (h, q, n)]
        # kv_b_proj is absorbed into the queries and the output (latent_expansion_parameters).
        shapes = [
            (q, self.q_lora_rank or h, n),
            (self.kv_lora_rank + self.qk_rope_head_dim, h, n),
            (h, self.attention_output_size, n),
        ]
        if self.q_lora_rank:
            shapes.append((self.q_lora_rank, h, n))
        return shapes

    def linear_shapes(self) -> list[tuple[int, int, int]]:
        """(out_features, in_features, how many) of the quantizable linear layers of the whole
        decoder: every layer's attention, the dense MLPs, and each expert of the sparse ones."""
        h = self.hidden_size
        shapes = self.attention_linear_shapes()
        dense = self.num_dense_mlp_layers
        if dense:
            i = self.intermediate_size
            shapes += [(i, h, dense), (h, i, dense)] + ([(i, h, dense)] if self.gated_mlp else [])
        if self.num_sparse_layers:
            m, experts = self.moe_intermediate_size, self.num_sparse_layers * self.num_experts
            shapes += [(m, h, experts), (m, h, experts), (h, m, experts)]
        if self.num_sparse_layers and self.shared_expert_intermediate_size:
            s, layers = self.shared_expert_intermediate_size, self.num_sparse_layers
            shapes += [(s, h, layers), (s, h, layers), (h, s, layers)]
        if self.num_mamba_layers:
            # in_proj gives the gate, the convolution's channels and one time step per head.
            i, m = self.mamba_intermediate_size, self.num_mamba_layers
            shapes += [(i + self.mamba_conv_dim + self.mamba_num_heads, h, m), (h, i, m)]
        if self.num_linear_attention_layers:
            # in_proj_qkv, in_proj_z, in_proj_b and in_proj_a (held fused), and out_proj.
            v, m = self.linear_value_dim, self.num_linear_attention_layers
            heads = self.linear_num_value_heads
            shapes += [(self.linear_conv_dim + v + 2 * heads, h, m), (h, v, m)]
        if "conv" in self.layer_types:
            # The short convolution's in_proj (B, C and x) and out_proj.
            m = self.layer_types.count("conv")
            shapes += [(3 * h, h, m), (h, h, m)]
        return shapes

    def layer_linear_shapes(self, layer: int) -> dict[str, tuple[int, int, int]]:
        """(out_features, in_features, how many) of layer `layer`'s projections by llama.cpp's short
        names: q, k, v, o, and gate, up, down, one of each per expert in a sparse layer."""
        q, kv, h = self.q_size, self.kv_size, self.hidden_size
        sparse = self.is_sparse_layer(layer)
        width = self.moe_intermediate_size if sparse else self.intermediate_size
        count = self.num_experts if sparse else 1
        return {
            "q": (q, h, 1),
            "k": (kv, h, 1),
            "v": (kv, h, 1),
            "o": (h, q, 1),
            "gate": (width, h, count),
            "up": (width, h, count),
            "down": (h, width, count),
        }

    def active_linear_parameters(self) -> int:
        """Weights of the linear layers one token goes through: of a sparse layer's experts, only the
        num_experts_per_tok it is routed to (Qwen3-30B-A3B: about 3B of 30B)."""
        total = sum(out * inp * count for out, inp, count in self.linear_shapes())
        if not self.num_sparse_layers:
            return total
        idle = self.num_experts - self.num_experts_per_tok
        return total - 3 * self.hidden_size * self.moe_intermediate_size * idle * self.num_sparse_layers

    def vocab_parameters(self) -> int:
        """The embedding and, unless tied, the LM head."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def unquantized_parameters(self) -> int:
        """Embeddings, LM head, norms, attention biases and sinks, expert routers and expert biases,
        latent attention's absorbed kv_b_proj: kept in 16 bits by every variant."""
        embeddings = self.vocab_parameters()
        norms = (self.norms_per_layer * self.num_hidden_layers + 1) * self.hidden_size
        norms *= 2 if self.norm_bias else 1
        norms += self.activation_parameters * self.num_hidden_layers
        if self.qk_norm:
            norms += 2 * self.head_dim * self.num_attention_layers
        if self.wide_qk_norm:
            norms += (self.q_size + self.kv_size) * self.num_hidden_layers
        # Latent attention's norms of its low-rank query and of its compressed keys and values.
        norms += (self.q_lora_rank + self.kv_lora_rank) * self.num_hidden_layers
        # A Mamba-2 layer's convolution (weights and bias), time-step bias, A, D and gated norm.
        conv = self.mamba_conv_dim * (self.mamba_conv_kernel + 1)
        norms += (conv + 3 * self.mamba_num_heads + self.mamba_intermediate_size) * self.num_mamba_layers
        # A gated DeltaNet layer's convolution (no bias), time-step bias, A and gated norm (per head).
        linear = self.linear_conv_dim * self.linear_conv_kernel + 2 * self.linear_num_value_heads
        norms += (linear + self.linear_value_head_dim) * self.num_linear_attention_layers
        norms += self.hidden_size * self.short_conv_kernel * self.layer_types.count("conv")
        biases = self.q_size + 2 * self.kv_size if self.attention_bias else 0
        biases += self.hidden_size if self.attention_output_bias else 0
        biases += self.num_attention_heads if self.attention_sinks else 0
        # A correction bias is held in float32 (as transformers holds it) and counted here as one
        # 16-bit parameter: 2 bytes per expert and layer short under bf16.
        router = self.hidden_size + (1 if self.router_score_bias else 0)
        if self.expert_bias:
            router += 1 + 2 * self.moe_intermediate_size + self.hidden_size
        routers = self.num_sparse_layers * self.num_experts * router
        routers += self.num_sparse_layers * self.hidden_size if self.shared_expert_gate else 0
        # kv_b_proj expands the latent into each head's key and value; served absorbed, it is
        # multiplied into the queries and the attention's output as a float matrix (as vLLM does).
        expansion = self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim) * self.kv_lora_rank
        return embeddings + norms + (biases + expansion) * self.num_attention_layers + routers

    def num_parameters(self) -> int:
        linear = sum(out * inp * count for out, inp, count in self.linear_shapes())
        return linear + self.unquantized_parameters()

    def per_rank(self, size: int) -> ModelArchitecture:
        """The slice one of `size` tensor-parallel ranks holds: its query and key/value heads, its
        part of the MLP, of every expert's channels and of the padded vocabulary; hidden size, norms
        and routers are whole on every rank. Raises when the model does not split into `size` ranks."""
        if size == 1:
            return self
        if "conv" in self.layer_types:
            raise ValueError(
                "Pagoda serves LFM2's short-convolution models on one GPU: their conv layers do not split "
                "over tensor-parallel ranks; use a tensor-parallel size of 1"
            )
        dense = self.num_dense_mlp_layers > 0
        return replace(
            self,
            num_attention_heads=split_evenly(self.num_attention_heads, size, "attention heads"),
            num_key_value_heads=kv_heads_per_rank(self.num_key_value_heads, size),
            intermediate_size=(
                split_evenly(self.intermediate_size, size, "MLP channels")
                if dense
                else self.intermediate_size
            ),
            moe_intermediate_size=(
                split_evenly(self.moe_intermediate_size, size, "expert MLP channels")
                if self.num_sparse_layers
                else self.moe_intermediate_size
            ),
            shared_expert_intermediate_size=split_evenly(
                self.shared_expert_intermediate_size, size, "shared expert MLP channels"
            ),
            vocab_size=padded_vocab_size(self.vocab_size, size) // size,
            # A Mamba-2 layer's heads and their groups (whose B and C, and whose norm, they share).
            mamba_num_heads=split_evenly(self.mamba_num_heads, size, "Mamba-2 heads"),
            mamba_groups=split_evenly(self.mamba_groups, size, "Mamba-2 groups of heads"),
            # A gated DeltaNet layer's key heads, and the value heads that share them, by rank.
            linear_num_key_heads=split_evenly(self.linear_num_key_heads, size, "gated DeltaNet key heads"),
            linear_num_value_heads=split_evenly(
                self.linear_num_value_heads, size, "gated DeltaNet value heads"
            ),
        )


def fitted_group_size(in_features: int, preferred: int) -> int:
    """The largest power of two up to `preferred` that divides in_features: the group a layer of that
    width really gets (SmolLM2-135M's 576 inputs take int4 groups of 64, not 128)."""
    size = preferred
    while in_features % size:
        size //= 2
    return size


@dataclass(frozen=True)
class WeightFormat:
    """Storage of a quantized linear layer: packed weights plus per-group and per-row metadata."""

    bits: int
    group_size: int = 0  # 0: no groups
    group_bytes: float = 0.0  # scale (+ zero point) stored per group of group_size inputs
    row_bytes: float = 0.0  # per output channel (per-channel scales)

    def linear_bytes(self, out_features: int, in_features: int) -> float:
        groups = 0
        if self.group_size:
            groups = out_features * (in_features // fitted_group_size(in_features, self.group_size))
        return (
            out_features * in_features * self.bits / 8
            + groups * self.group_bytes
            + out_features * self.row_bytes
        )


WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "none": WeightFormat(bits=16),
    "bf16": WeightFormat(bits=16),
    "fp16": WeightFormat(bits=16),
    "float32": WeightFormat(bits=32),
    "int8": WeightFormat(bits=8, row_bytes=2),  # symmetric, one fp16 scale per output channel
    "fp8": WeightFormat(bits=8, row_bytes=4),  # e4m3, one float32 scale per output channel
    # Asymmetric groups of 128: an fp16 scale and an fp16 zero point per group.
    "int4": WeightFormat(bits=4, group_size=128, group_bytes=4),
    # AWQ and GPTQ checkpoints are converted at load to that int4 layout: their 4-bit zero points
    # become fp16 offsets and GPTQ's g_idx (refused unless trivial) is dropped.
    "awq": WeightFormat(bits=4, group_size=128, group_bytes=4),
    "gptq": WeightFormat(bits=4, group_size=128, group_bytes=4),
    # A GGUF file of 4-bit blocks; weight_bytes' gguf_block names the file's real block type.
    "gguf": WeightFormat(bits=4, group_size=32, group_bytes=4),
}
# GGUF block types served packed (quantization/gguf_blocks.py), in the layout of WeightFormat: int4
# in groups of 32 with an fp16 scale and offset each (Q4_0, Q4_1, Q4_K: 5 bits a weight), int8 in
# groups of 32 with an fp16 scale (Q5_0, Q8_0: 8.5), int8 in groups of 16 (Q6_K: 9). The other
# types a file may hold (Q5_1, Q2_K, Q3_K, Q5_K, and F16/BF16/F32 projections) have no packed
# layout: they are dequantized at load and held in the model's float dtype.
GGUF_BLOCK_FORMATS: dict[str, WeightFormat] = {
    "Q4_0": WEIGHT_FORMATS["gguf"],
    "Q4_1": WEIGHT_FORMATS["gguf"],
    "Q4_K": WEIGHT_FORMATS["gguf"],
    "Q5_0": WeightFormat(bits=8, group_size=32, group_bytes=2),
    "Q8_0": WeightFormat(bits=8, group_size=32, group_bytes=2),
    "Q6_K": WeightFormat(bits=8, group_size=16, group_bytes=2),
}


def _more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


_LAYER_PICKS = {
    "all": lambda layer, n: True,
    "more_bits": _more_bits,
    "first_eighth": lambda layer, n: layer < max(4, n // 8),
}
_FLOAT_FILE_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class GGUFFileType:
    """A GGUF file type as llama.cpp's mix (llama-quant.cpp's llama_tensor_get_type) stores each
    projection: `main` for most, attn_v (`value`) and ffn_down (`down`, a sparse layer's experts
    included) wider in the layers `value_layers` and `down_layers` pick, and in a model of exactly
    8 experts attn_k and attn_v in Q8_0 and attn_output in `eight_experts_output`; a fused attn_qkv
    in `fused_qkv`. Where the mix turns on what sizing cannot see, the wider type bounds it: a dense
    model's other attn_v is counted at `large_value`, where llama.cpp widens a 70B model's (Q4_K_M:
    Q5_K), and an importance matrix's choices at theirs."""

    main: str
    value: str | None = None
    value_layers: str = "all"  # a key of _LAYER_PICKS
    large_value: str | None = None
    down: str | None = None
    down_layers: str = "all"
    eight_experts_output: str | None = None
    fused_qkv: str | None = None  # attn_qkv, where the checkpoint fuses q, k and v (Phi-3)

    def projection_type(self, arch: ModelArchitecture, layer: int, projection: str) -> str:
        """The block type of layer `layer`'s projection (ModelArchitecture.layer_linear_shapes'
        names)."""
        n = arch.num_hidden_layers
        if arch.num_experts == 8 and self.main not in _FLOAT_FILE_TYPES:
            if projection in ("k", "v"):
                return "Q8_0"
            if projection == "o" and self.eight_experts_output:
                return self.eight_experts_output
        if arch.fused_qkv and projection in ("q", "k", "v"):
            return self.fused_qkv or self.main
        if projection == "v" and self.value and _LAYER_PICKS[self.value_layers](layer, n):
            return self.value
        if projection == "v" and self.large_value and not arch.num_experts:
            return self.large_value
        if projection == "down" and self.down and _LAYER_PICKS[self.down_layers](layer, n):
            return self.down
        return self.main


# By the name llama.cpp's files carry (`Meta-Llama-3-8B-Instruct.Q4_K_M.gguf`); the bare block types
# are the names the runtime gives a file from its tensors when its name does not tell.
GGUF_FILE_TYPES: dict[str, GGUFFileType] = {
    **{name: GGUFFileType(name) for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_1", "Q8_0")},
    **{name: GGUFFileType(name) for name in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")},
    # With an importance matrix, ffn_down of the first eighth of the layers is Q5_1.
    "Q5_0": GGUFFileType("Q5_0", down="Q5_1", down_layers="first_eighth"),
    # Mixes whose wider tensors are dequantized like the rest, or packed in fewer bytes (Q4_K).
    **{name: GGUFFileType(name[:4]) for name in ("Q2_K_S", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q5_K_S", "Q5_K_M")},
    "Q4_K_S": GGUFFileType(
        "Q4_K", value="Q5_K", down="Q5_K", down_layers="first_eighth", eight_experts_output="Q5_K"
    ),
    "Q4_K_M": GGUFFileType(
        "Q4_K",
        value="Q6_K",
        value_layers="more_bits",
        large_value="Q5_K",
        down="Q6_K",
        down_layers="more_bits",
        eight_experts_output="Q5_K",
        fused_qkv="Q5_K",
    ),
}
# A GGUF source whose name does not say its type is sized as dequantized, the most it can take.
UNNAMED_GGUF_FILE_TYPE = "F16"

# Bytes of one element of the tensors a model keeps unquantized, by the runtime's --dtype names.
FLOAT_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


def gguf_block_type(source: str) -> str:
    """The GGUF_FILE_TYPES name of a GGUF source, as far as its file name tells (`model.Q8_0.gguf`,
    `model-Q4_K_M.gguf`; the bundled model is Q4_1); UNNAMED_GGUF_FILE_TYPE when it does not tell."""
    name = BUNDLED_FILE if source.split("://", 1)[-1] == BUNDLED_MODEL_NAME else source
    file_name = name.rsplit("/", 1)[-1].upper()
    named = (b for b in GGUF_FILE_TYPES if re.search(rf"(?<![A-Z0-9]){b}(?![A-Z0-9_])", file_name))
    return next(named, UNNAMED_GGUF_FILE_TYPE)


def gguf_file_type(source: str, main: str) -> str:
    """The GGUF_FILE_TYPES name the runtime sizes a file by, once its tensors show the block type
    of most projections (`main`): its name's, as the operator sized it, where that agrees."""
    named = gguf_block_type(source)
    return named if GGUF_FILE_TYPES[named].main == main else main


def gguf_is_packed(file_type: str) -> bool:
    """Whether most projections of a file of this GGUF_FILE_TYPES name have a packed layout."""
    return GGUF_FILE_TYPES[file_type].main in GGUF_BLOCK_FORMATS


def _gguf_layer_bytes(arch: ModelArchitecture, file_type: str, float_bytes: int) -> list[tuple[float, float]]:
    """Each layer's (projections besides the experts, one expert) of one rank of a GGUF file served
    `gguf`, every tensor in its own block type (GGUFFileType.projection_type): packed where that
    type has a layout, floats elsewhere."""
    kind = _gguf_file_type(file_type)
    dequantized = WeightFormat(bits=8 * float_bytes)
    layers = []
    for layer in range(arch.num_hidden_layers):
        shared = expert = 0.0
        for projection, (out, inp, count) in arch.layer_linear_shapes(layer).items():
            fmt = GGUF_BLOCK_FORMATS.get(kind.projection_type(arch, layer, projection), dequantized)
            if arch.is_sparse_layer(layer) and projection in ("gate", "up", "down"):
                expert += fmt.linear_bytes(out, inp)
            else:
                shared += fmt.linear_bytes(out, inp) * count
        layers.append((shared, expert))
    return layers


def weight_bytes(
    arch: ModelArchitecture,
    quantization: str,
    float_dtype: str = "bfloat16",
    gguf_block: str | None = None,
    vocab_dtype: str | None = None,
) -> int:
    """float_dtype: what the unquantized tensors are held in (every tensor, for "none");
    gguf_block: for "gguf", the file's GGUF_FILE_TYPES name (Q4_0, Q4_K_M, ...) when it is known;
    vocab_dtype: what the embedding and LM head are held in where not float_dtype
    (quantization_selection.cpu_vocab_dtype)."""
    if quantization not in WEIGHT_FORMATS:
        raise ValueError(
            f"unknown quantization {quantization!r}; use one of {', '.join(sorted(WEIGHT_FORMATS))}"
        )
    if float_dtype not in FLOAT_DTYPE_BYTES:
        raise ValueError(f"unknown dtype {float_dtype!r}; use one of {', '.join(FLOAT_DTYPE_BYTES)}")
    float_bytes = _float_bytes(quantization, float_dtype)
    if quantization == "gguf" and gguf_block is not None:
        layers = _gguf_layer_bytes(arch, gguf_block, float_bytes)
        linear = sum(shared + expert * arch.num_experts for shared, expert in layers)
    else:
        fmt = _linear_format(quantization, float_dtype)
        linear = sum(fmt.linear_bytes(out, inp) * count for out, inp, count in arch.linear_shapes())
    unquantized = arch.unquantized_parameters() * float_bytes
    if vocab_dtype is not None:
        # Held apart, tied or not: the lookup table and the LM head, each in vocab_dtype.
        held = 2 * arch.vocab_size * arch.hidden_size * FLOAT_DTYPE_BYTES[vocab_dtype]
        unquantized += held - arch.vocab_parameters() * float_bytes
    return int(linear + unquantized)


def _gguf_file_type(file_type: str) -> GGUFFileType:
    if file_type not in GGUF_FILE_TYPES:
        raise ValueError(f"unknown GGUF file type {file_type!r}; use one of {', '.join(GGUF_FILE_TYPES)}")
    return GGUF_FILE_TYPES[file_type]


def _linear_format(quantization: str, float_dtype: str) -> WeightFormat:
    """How the projections are held, but those of a GGUF file of a known type (_gguf_layer_bytes)."""
    if quantization == "none":
        return WeightFormat(bits=8 * _float_bytes(quantization, float_dtype))
    return WEIGHT_FORMATS[quantization]


def _float_bytes(quantization: str, float_dtype: str) -> int:
    return 4 if quantization == "float32" else FLOAT_DTYPE_BYTES[float_dtype]


def decode_read_bytes(stored_bytes: int, embedding_bytes: int, tied: bool) -> int:
    """Bytes of weights one decode step reads, from the bytes stored: every tensor once except the
    input embedding, of which a step reads only its batch's rows. A tied embedding is the LM head
    too, read whole for the logits, so then nothing is left out."""
    return stored_bytes if tied else stored_bytes - embedding_bytes


def decode_weight_bytes(
    arch: ModelArchitecture,
    quantization: str,
    float_dtype: str = "bfloat16",
    gguf_block: str | None = None,
    vocab_dtype: str | None = None,
) -> int:
    """decode_read_bytes of weight_bytes' estimate (same arguments): the weight traffic that bounds
    batch-1 decode at memory bandwidth / these bytes tokens per second. A token reads only the
    experts it is routed to."""
    stored = weight_bytes(arch, quantization, float_dtype, gguf_block, vocab_dtype)
    if arch.num_sparse_layers:
        idle = arch.num_experts - arch.num_experts_per_tok
        if quantization == "gguf" and gguf_block is not None:
            float_bytes = _float_bytes(quantization, float_dtype)
            experts = sum(expert for _, expert in _gguf_layer_bytes(arch, gguf_block, float_bytes))
        else:
            fmt = _linear_format(quantization, float_dtype)
            width, hidden = arch.moe_intermediate_size, arch.hidden_size
            expert = 2 * fmt.linear_bytes(width, hidden) + fmt.linear_bytes(hidden, width)
            experts = expert * arch.num_sparse_layers
        stored -= int(experts * idle)
    vocab_bytes = FLOAT_DTYPE_BYTES[vocab_dtype] if vocab_dtype else _float_bytes(quantization, float_dtype)
    embedding = arch.vocab_size * arch.hidden_size * vocab_bytes
    # A vocab_dtype holds the LM head apart from the lookup table even when tied (weight_bytes).
    return decode_read_bytes(stored, embedding, arch.tie_word_embeddings and vocab_dtype is None)


def kv_bytes_per_token(arch: ModelArchitecture, kv_dtype: str = "auto") -> int:
    """Keys and values of one token in every attention layer; a rank's cache: its slice (`per_rank`)."""
    return arch.num_attention_layers * kv_layer_bytes_per_token(arch, kv_dtype)


def state_bytes(arch: ModelArchitecture, kv_dtype: str = "auto") -> int:
    """What one sequence holds in every layer's recurrent state (ModelArchitecture.state_numel:
    Mamba-2, gated DeltaNet and short-convolution layers), in the KV cache's dtype as vLLM's
    default keeps it; 0 for a model without such layers."""
    numel = sum(arch.state_numel(layer) for layer in range(arch.num_hidden_layers))
    return numel * KV_DTYPE_BYTES[_state_dtype(kv_dtype)]


def _state_dtype(kv_dtype: str) -> str:
    # An fp8 KV cache does not make the recurrent state fp8: it stays in the model's dtype.
    return "auto" if kv_dtype.startswith("fp8") else kv_dtype


def kv_layer_bytes_per_token(arch: ModelArchitecture, kv_dtype: str = "auto") -> int:
    """Keys and values of one token in one layer (ModelArchitecture.kv_cache_shape)."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPE_BYTES)}")
    return arch.kv_cache_shape.numel * KV_DTYPE_BYTES[kv_dtype]


def kv_bytes_per_block(arch: ModelArchitecture, block_size: int, kv_dtype: str = "auto") -> int:
    return block_size * kv_bytes_per_token(arch, kv_dtype)


def kv_bytes_for_context(arch: ModelArchitecture, tokens: int, kv_dtype: str = "auto") -> int:
    """Keys and values one sequence of `tokens` holds: every token in the full-attention layers, at
    most the window (or chunk) in the windowed ones (the runtime frees the blocks behind it). A
    hybrid's recurrent states are apart (state_bytes), held for every running sequence at once."""
    sliding = arch.num_sliding_layers
    held = (arch.num_attention_layers - sliding) * tokens
    if sliding:
        held += sliding * min(tokens, arch.window)
    return held * kv_layer_bytes_per_token(arch, kv_dtype)


@dataclass(frozen=True)
class KVPools:
    """KV blocks of the full-attention layers and of the sliding-window layers, each layer kind in a
    pool of its own. full_blocks 0: every layer slides; window_blocks 0: no layer's window is
    shorter than the context, and all share the one pool."""

    full_blocks: int
    window_blocks: int = 0


def window_blocks_needed(window: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int) -> int:
    """Window blocks the running sequences can hold at once: each the blocks its next token's window
    touches, plus those of the tokens a step adds (at most a step's budget, and a partial block each)."""
    per_sequence = -(-(window - 1) // block_size) + 2
    return max_num_seqs * per_sequence + -(-max_num_batched_tokens // block_size)


def kv_pools(
    arch: ModelArchitecture,
    budget_bytes: int,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_dtype: str = "auto",
) -> KVPools:
    """How a KV budget is split between the layer kinds. The sliding-window layers get the blocks
    their running sequences can ever hold at once (window_blocks_needed), never more than the
    full-attention layers get; those get the rest. Without a window shorter than the context every
    layer shares one pool, as before windows."""
    layer_block = block_size * kv_layer_bytes_per_token(arch, kv_dtype)
    # A hybrid model's Mamba layers hold their states (one per running sequence and a few more)
    # before any KV.
    budget_bytes -= (max_num_seqs + STATE_SLOTS_BEYOND_SEQS) * state_bytes(arch, kv_dtype)
    window = arch.window
    sliding = arch.num_sliding_layers if window is not None and window < max_model_len else 0
    layers = arch.num_attention_layers
    full = layers - sliding
    if not sliding:
        return KVPools(max(budget_bytes, 0) // (layer_block * layers))
    if not full:
        return KVPools(0, budget_bytes // (layer_block * sliding))
    equal = budget_bytes // (layer_block * layers)
    needed = window_blocks_needed(window, block_size, max_num_seqs, max_num_batched_tokens)
    if needed >= equal:
        return KVPools(equal, equal)
    return KVPools((budget_bytes - needed * sliding * layer_block) // (full * layer_block), needed)


def check_tensor_parallel(
    arch: ModelArchitecture, size: int, quantization: str = "none", group_size: int | None = None
) -> ModelArchitecture:
    """The slice of `arch` each of `size` ranks holds, or an error saying which sizes would work.

    Besides the heads and the MLP (ModelArchitecture.per_rank), a grouped quantization must split
    the inputs of the row-parallel projections (o_proj, down_proj) at group boundaries.
    group_size: a pre-quantized checkpoint's own group (-1: one per row); None: the format's.
    """
    if size < 1:
        raise ValueError(f"the tensor-parallel size must be at least 1, not {size}")
    sliced = arch.per_rank(size)
    fmt = WEIGHT_FORMATS.get(quantization)
    if fmt is None or not fmt.group_size or size == 1:
        return sliced
    row_parallel = {"attention output": arch.attention_output_size}
    if arch.num_dense_mlp_layers:
        row_parallel["MLP down"] = arch.intermediate_size
    if arch.num_sparse_layers:
        row_parallel["expert down"] = arch.moe_intermediate_size
    for what, inputs in row_parallel.items():
        group = inputs if group_size == -1 else group_size or fitted_group_size(inputs, fmt.group_size)
        # A group that spans the whole row is a per-row scale, which every slice of the row shares.
        if group != inputs and (inputs // size) % group:
            sizes = ", ".join(map(str, dividing_sizes(inputs // group)))
            other = (
                "a checkpoint quantized in smaller groups"
                if quantization in ("awq", "gptq")
                else "int8 or fp8 quantization, which have no groups"
            )
            raise ValueError(
                f"{quantization} weights come in groups of {group} inputs, and the {what} projection's "
                f"{inputs} inputs do not split into whole groups over {size} tensor-parallel ranks; "
                f"use a tensor-parallel size of {sizes}, or {other}"
            )
    return sliced


def lora_slot_bytes(
    arch: ModelArchitecture,
    max_loras: int,
    max_rank: int,
    dtype: str = "bfloat16",
    tensor_parallel_size: int = 1,
) -> int:
    """Device memory of the runtime's LoRA slots on each GPU (--enable-lora): --max-loras slots, each
    with A [rank, in] and B [out, rank] at --max-lora-rank on q, k, v, o, gate, up and down of every
    layer, whatever the adapters in them target (an MoE layer's MLP takes none), in the model's
    dtype ("auto": 16 bits). Under tensor parallelism a column-parallel projection's B and a
    row-parallel one's A are split like its base weight (the per-rank slice's sizes), the other
    half whole."""
    sliced = arch.per_rank(tensor_parallel_size)
    q, kv, h, i = sliced.q_size, sliced.kv_size, sliced.hidden_size, sliced.intermediate_size
    attention = (q + h) * 2 + (kv + h) * 2  # q and o; k and v
    mlp = (i + h) * 3  # gate, up and down
    per_rank_unit = attention * sliced.num_attention_layers + mlp * sliced.num_dense_mlp_layers
    return max_loras * max_rank * per_rank_unit * FLOAT_DTYPE_BYTES.get(dtype, 2)


def all_reduce_bytes(tensor_parallel_size: int) -> int:
    """Memory each GPU of a tensor-parallel group spends on the collectives beyond one GPU's."""
    return 0 if tensor_parallel_size == 1 else NCCL_COMMUNICATOR_BYTES


@dataclass(frozen=True)
class FitResult:
    fits: bool
    weight_bytes: int  # per GPU
    kv_bytes: int  # one sequence of max_model_len tokens, per GPU
    overhead_bytes: int
    capacity_bytes: int  # of one GPU
    all_reduce_bytes: int = 0
    tensor_parallel_size: int = 1
    draft_weight_bytes: int = 0  # a speculative-decoding draft model's (or EAGLE head's), per GPU
    draft_kv_bytes: int = 0  # the draft's KV of one sequence of max_model_len tokens, per GPU
    eagle_head: bool = False  # the draft is an EAGLE head, whole on every GPU
    lora_bytes: int = 0  # the LoRA adapter slots (lora_slot_bytes)
    state_bytes: int = 0  # a hybrid's recurrent states, one per running sequence and the spares

    @property
    def required_bytes(self) -> int:
        return (
            self.weight_bytes
            + self.kv_bytes
            + self.overhead_bytes
            + self.all_reduce_bytes
            + self.draft_weight_bytes
            + self.draft_kv_bytes
            + self.lora_bytes
            + self.state_bytes
        )

    def describe(self) -> str:
        verdict = "fits in" if self.fits else "does not fit in"
        per_gpu = ""
        collectives = ""
        if self.tensor_parallel_size > 1:
            per_gpu = f" per GPU of {self.tensor_parallel_size}"
            collectives = f", all-reduce buffers {self.all_reduce_bytes / GIB:.1f} GiB"
        if self.lora_bytes:
            collectives += f", LoRA adapter slots {self.lora_bytes / GIB:.2f} GiB"
        if self.state_bytes:
            collectives += f", recurrent states of the running sequences {self.state_bytes / GIB:.2f} GiB"
        draft = ""
        if self.draft_weight_bytes:
            what = "EAGLE head" if self.eagle_head else "draft"
            draft = (
                f", {what} weights {self.draft_weight_bytes / GIB:.2f} GiB and KV "
                f"{self.draft_kv_bytes / GIB:.2f} GiB"
            )
        return (
            f"needs {self.required_bytes / GIB:.1f} GiB{per_gpu} (weights {self.weight_bytes / GIB:.1f} GiB, "
            f"KV for one full-length sequence {self.kv_bytes / GIB:.2f} GiB{draft}, overhead "
            f"{self.overhead_bytes / GIB:.1f} GiB{collectives}), which {verdict} "
            f"{self.capacity_bytes / GIB:.1f} GiB"
        )


@dataclass(frozen=True)
class DraftModel:
    """A speculative-decoding draft model, as the fit check counts it: its weights and its own KV
    cache, split over the target's tensor-parallel ranks as the runtime shards it (engine/build.py),
    so each GPU holds one slice; a draft that does not split over them cannot run."""

    architecture: ModelArchitecture
    quantization: str
    gguf_block: str | None = None
    # Float parameters every rank holds whole beside its slice (an MTP layer's eh_proj and norms).
    whole_parameters: int = 0


def mtp_layer_architecture(arch: ModelArchitecture) -> ModelArchitecture:
    """A checkpoint's first multi-token-prediction layer as a one-layer model of its shape
    (executor/models/mtp_head.py): a mixture of experts where the model's next layer would be one."""
    return replace(
        arch,
        num_hidden_layers=1,
        mlp_only_layers=() if arch.is_sparse_layer(arch.num_hidden_layers) else (0,),
        layer_types=arch.layer_types[-1:],
        num_nextn_predict_layers=0,
    )


def mtp_draft(arch: ModelArchitecture, quantization: str) -> DraftModel:
    """The multi-token-prediction layer speculative decoding's mtp method drafts with, as the fit
    check counts it: its decoder layer split over the ranks like the model's and held in its
    quantization; a final norm and LM head of its own; the model's embedding borrowed; and eh_proj
    with its two input norms, whole on every rank in 16 bits."""
    # One vocabulary matrix, the LM head: the embedding is the model's.
    layer = replace(mtp_layer_architecture(arch), tie_word_embeddings=True)
    hidden = arch.hidden_size
    return DraftModel(layer, quantization, whole_parameters=2 * hidden * hidden + 2 * hidden)


class WholeDraft(Protocol):
    """A draft held whole by every tensor-parallel rank, never split: an EAGLE head
    (contract/eagle_sizing.py's EagleHeadShape)."""

    def weight_bytes(self) -> int: ...

    def kv_bytes_for_context(self, tokens: int) -> int: ...


def fits(
    arch: ModelArchitecture,
    quantization: str,
    max_model_len: int,
    capacity_bytes: int,
    *,
    kv_dtype: str = "auto",
    gguf_block: str | None = None,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    tensor_parallel_size: int = 1,
    draft: DraftModel | None = None,
    head: WholeDraft | None = None,
    lora_bytes: int = 0,
    max_num_seqs: int = 1,
) -> FitResult:
    """Whether the weights plus the KV cache of one max_model_len sequence fit the device memory,
    with a hybrid's recurrent states of max_num_seqs sequences (held from the start) and a draft
    model's (or an EAGLE head's) weights and KV of that sequence beside them when it
    speculates with one. An EAGLE head is held whole by every rank, so each GPU counts all of it.

    With tensor_parallel_size > 1 every figure is one GPU's (capacity_bytes too): its slice of the
    weights and of the KV heads (the draft's too), plus the all-reduce buffers. Raises ValueError
    (check_tensor_parallel) when the model or its draft cannot be split that way.
    """
    sliced = check_tensor_parallel(arch, tensor_parallel_size, quantization)
    weights = weight_bytes(sliced, quantization, gguf_block=gguf_block)
    kv = kv_bytes_for_context(sliced, max_model_len, kv_dtype)
    states = (max_num_seqs + STATE_SLOTS_BEYOND_SEQS) * state_bytes(sliced, kv_dtype)
    collectives = all_reduce_bytes(tensor_parallel_size)
    draft_weights = draft_kv = 0
    if draft is not None:
        draft_slice = check_tensor_parallel(draft.architecture, tensor_parallel_size, draft.quantization)
        draft_weights = weight_bytes(draft_slice, draft.quantization, gguf_block=draft.gguf_block)
        draft_weights += draft.whole_parameters * FLOAT_DTYPE_BYTES["bfloat16"]
        draft_kv = kv_bytes_for_context(draft_slice, max_model_len, kv_dtype)
    if head is not None:
        draft_weights = head.weight_bytes()
        draft_kv = head.kv_bytes_for_context(max_model_len)
    result = FitResult(
        fits=False,
        weight_bytes=weights,
        kv_bytes=kv,
        overhead_bytes=overhead_bytes,
        capacity_bytes=capacity_bytes,
        all_reduce_bytes=collectives,
        tensor_parallel_size=tensor_parallel_size,
        draft_weight_bytes=draft_weights,
        draft_kv_bytes=draft_kv,
        eagle_head=head is not None,
        lora_bytes=lora_bytes,
        state_bytes=states,
    )
    return replace(result, fits=result.required_bytes <= capacity_bytes)
