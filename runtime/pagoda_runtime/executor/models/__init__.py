"""The model families: shared layers (layers.py, decoder.py), one module per family, and the registry
(registry.py) that maps Hugging Face architectures onto them."""

from pagoda_runtime.executor.models.decoder import CausalLM
from pagoda_runtime.executor.models.registry import FAMILIES, build_model, family_of, weight_shapes

__all__ = ["FAMILIES", "CausalLM", "build_model", "family_of", "weight_shapes"]
