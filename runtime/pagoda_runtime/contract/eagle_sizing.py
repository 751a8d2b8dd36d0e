"""An EAGLE head's shape and bytes, torch-free: what the runtime reserves for a head and what the
operator's fit check counts for one, by one rule.

A head (executor/models/eagle_head.py) holds `fc`, one decoder layer, and for EAGLE-3 its final norm
and an LM head over the draft vocabulary (and its own embedding where the checkpoint carries one);
EAGLE-1 uses the target's embedding and LM head. Its projections stay unquantized, in the model's
dtype. Its KV cache is one layer's, for as many tokens as the target's cache, in the model's dtype
(the target's --kv-cache-dtype does not apply to it). Under tensor parallelism every rank holds the
whole head, so sizing.fits counts it whole on each GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pagoda_runtime.contract.sizing import FLOAT_DTYPE_BYTES, ModelArchitecture, kv_layer_bytes_per_token

# The files a head's weights are saved in, either one.
HEAD_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# The config.json architecture each method loads.
HEAD_ARCHITECTURES = {"eagle3": "LlamaForCausalLMEagle3", "eagle": "LlamaForCausalLM"}
# The head's attention input: EAGLE-3's layer attends over [norm(embedding), norm(hidden)].
_ATTENTION_INPUTS = {"eagle3": 2, "eagle": 1}
# fc's input: three target hidden states (EAGLE-3), or [embedding, last hidden state] (EAGLE-1).
_FC_INPUTS = {"eagle3": 3, "eagle": 2}
# RMSNorms of hidden_size: input, hidden and post-attention norms and the final one (EAGLE-3);
# the post-attention norm alone (EAGLE-1's layer takes fc's output unnormed, the target's norm ends).
_NORMS = {"eagle3": 4, "eagle": 1}
_REQUIRED_CONFIG = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


def draft_vocab_size(method: str, config: Mapping[str, Any], vocab_size: int) -> int:
    """The tokens the head drafts: an EAGLE-3 head's draft vocabulary, else the target's."""
    return (config.get("draft_vocab_size") or vocab_size) if method == "eagle3" else vocab_size


@dataclass(frozen=True)
class EagleHeadShape:
    """An EAGLE head as sizing counts it. architecture: its decoder layer's shape (one layer,
    whatever num_hidden_layers says) and the target's vocabulary; draft_vocab_size: the rows of
    EAGLE-3's LM head; fc_bias: fc saved with a bias; own_embedding: an EAGLE-3 head saved with
    embed_tokens, which it uses in place of the target's."""

    method: str
    architecture: ModelArchitecture
    draft_vocab_size: int
    fc_bias: bool = False
    own_embedding: bool = False

    @classmethod
    def from_config(
        cls, method: str, config: Mapping[str, Any], tensor_names: Iterable[str] = ()
    ) -> EagleHeadShape:
        """The head of a config.json (and the names of the tensors saved beside it)."""
        missing = [key for key in _REQUIRED_CONFIG if key not in config]
        if missing:
            raise ValueError(
                f"the EAGLE head's config.json lacks {', '.join(missing)}: use the head's published "
                "config.json, which names its layer's shape"
            )
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        arch = ModelArchitecture(
            num_hidden_layers=1,
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            attention_bias=bool(config.get("attention_bias", False)),
        )
        return cls.from_tensors(method, arch, draft_vocab_size(method, config, arch.vocab_size), tensor_names)

    @classmethod
    def from_tensors(
        cls, method: str, architecture: ModelArchitecture, draft_vocab: int, tensor_names: Iterable[str]
    ) -> EagleHeadShape:
        """The head of that layer and draft vocabulary, saved as the tensors named."""
        names = {name.removeprefix("model.") for name in tensor_names}
        return cls(
            method,
            architecture,
            draft_vocab,
            fc_bias="fc.bias" in names,
            own_embedding=method == "eagle3" and "embed_tokens.weight" in names,
        )

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> EagleHeadShape:
        """The head a download or sizing Job reported (`to_facts`)."""
        return cls(**{**facts, "architecture": ModelArchitecture.from_facts(facts["architecture"])})

    def to_facts(self) -> dict[str, Any]:
        return asdict(self)

    def weight_bytes(self, float_dtype: str = "bfloat16") -> int:
        """Bytes of the head's weights as the runtime holds them, all in float_dtype."""
        arch, method = self.architecture, self.method
        hidden = arch.hidden_size
        qkv = arch.q_size + 2 * arch.kv_size
        params = _FC_INPUTS[method] * hidden * hidden + (hidden if self.fc_bias else 0)
        params += _ATTENTION_INPUTS[method] * hidden * qkv + (qkv if arch.attention_bias else 0)
        params += arch.q_size * hidden  # o_proj
        params += 3 * hidden * arch.intermediate_size  # gate, up and down
        params += _NORMS[method] * hidden
        if method == "eagle3":
            params += self.draft_vocab_size * hidden
            if self.own_embedding:
                params += arch.vocab_size * hidden
        return params * FLOAT_DTYPE_BYTES[float_dtype]

    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in the head's one layer, in the model's dtype."""
        return kv_layer_bytes_per_token(self.architecture, "auto")

    def kv_bytes_for_context(self, tokens: int) -> int:
        """The head's keys and values of one sequence of `tokens` (the target's cache holds as many)."""
        return tokens * self.kv_bytes_per_token()
