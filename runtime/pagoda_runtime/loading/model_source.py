"""Open a model source (a Hugging Face folder or a GGUF file): its ModelConfig, its tokenizer and a
lazy stream of its weights under Hugging Face names.

Projections a checkpoint stores quantized (AWQ and GPTQ folders; the GGUF block types with a
packed layout, sizing.GGUF_BLOCK_FORMATS) arrive as PackedWeights converted straight from the
stored blocks, or, when the caller does not keep them quantized, dequantized one tensor at a time;
GGUF tensors of the other block types are dequantized one tensor at a time.

Everything that can be checked without reading the weights (the architecture, every tensor's
presence and shape, truncated files) is checked before `load_model_source` returns, so a bad model
fails at start-up with one sentence; the weights themselves are read one tensor at a time while the
model consumes them, so a large model never sits in memory twice.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from pagoda_runtime.contract.bundled import resolve_model
from pagoda_runtime.contract.config import ModelConfig
from pagoda_runtime.contract.pooling import causal_architecture, classifier_of, matryoshka_of
from pagoda_runtime.contract.sizing import gguf_file_type
from pagoda_runtime.contract.weight_layout import is_projection
from pagoda_runtime.engine.sampling_params import MODEL_DEFAULTED_FIELDS
from pagoda_runtime.engine.tokenizer import Tokenizer
from pagoda_runtime.executor.models.hf_config import ConfigError
from pagoda_runtime.executor.models.mtp_head import mtp_weight_shapes
from pagoda_runtime.executor.models.registry import (
    GGUF_ARCHITECTURES,
    HF_ARCHITECTURES,
    family_of,
    weight_shapes,
)
from pagoda_runtime.executor.quantization.gguf_blocks import gguf_main_type, gguf_to_packed, is_packable
from pagoda_runtime.executor.quantization.hf_checkpoints import (
    CheckpointQuantization,
    parse_quantization_config,
    stored_shapes,
    to_packed,
)
from pagoda_runtime.executor.quantization.packed import PackedWeight, dequantize
from pagoda_runtime.loading import compressed_tensors, fp8_blocks, mxfp4
from pagoda_runtime.loading.gguf_reader import GGUFFile
from pagoda_runtime.loading.text_of_multimodal import text_config, text_tensor_name, wrapped_text_architecture

# Per-layer GGUF tensor names every family shares; a family adds its own (registry.GGUFLayout).
_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


class ModelLoadError(ValueError):
    pass


Weight = torch.Tensor | PackedWeight


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: Iterator[tuple[str, Weight]]  # Hugging Face names, each tensor read on demand
    tokenizer: Tokenizer
    # How the projections that arrive as PackedWeights were stored: "awq", "gptq" (compressed-tensors'
    # INT4 too) or "gguf"; "fp8" or "int8" for a checkpoint whose 8-bit projections arrive dequantized
    # (fp8_blocks.py, compressed_tensors.py); None when every weight arrives as a float tensor.
    quantization: str | None = None
    # For "gguf": the file's sizing.GGUF_FILE_TYPES name (Q4_0, Q4_K_M, ...) read from its tensors.
    gguf_block: str | None = None
    # For "awq" and "gptq": the checkpoint's group of inputs (-1: one per row), which a
    # tensor-parallel split must not cut.
    group_size: int | None = None
    # Every weight read as floats from the stored blocks, where that is exact and dequantizing the
    # PackedWeights is not (GGUF K-quants, whose packed scales are rounded to fp16).
    float_weights: Callable[[torch.dtype], Iterator[tuple[str, torch.Tensor]]] | None = None
    # The sampling its makers recommend (generation_config.json: temperature, top_p, ...), which
    # the server uses for what a request leaves out, as vLLM's --generation-config auto does.
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    # The Hugging Face folder it was read from (its sentence-transformers files say how an
    # embedding model pools: loading/sentence_transformers.py); None for a GGUF file or random weights.
    folder: Path | None = None

    def dequantized(self, dtype: torch.dtype) -> LoadedModel:
        """The same model with each PackedWeight turned into a float tensor as it streams past."""
        if self.float_weights is not None:
            weights = self.float_weights(dtype)
            return LoadedModel(
                self.config,
                weights,
                self.tokenizer,
                sampling_defaults=self.sampling_defaults,
                folder=self.folder,
            )
        weights = (
            (name, dequantize(weight, dtype) if isinstance(weight, PackedWeight) else weight)
            for name, weight in self.weights
        )
        return LoadedModel(
            self.config, weights, self.tokenizer, sampling_defaults=self.sampling_defaults, folder=self.folder
        )


def load_model_source(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    keep_quantized: bool = False,
    hf_overrides: dict[str, Any] | None = None,
) -> LoadedModel:
    """`path`: a Hugging Face model folder, a .gguf file, or the bundled model's name.

    keep_quantized: projections stored quantized arrive as PackedWeights instead of float tensors.
    hf_overrides: keys that replace config.json's (vLLM's --hf-overrides), for a folder only.
    """
    path = resolve_model(str(path))
    if hf_overrides and not path.is_dir():
        raise ModelLoadError(
            f"--hf-overrides changes a Hugging Face folder's config.json, and {path} is not one; drop the "
            "flag or serve the model's folder"
        )
    if path.is_dir():
        loaded = _load_hf_folder(path, dtype, hf_overrides or {})
    elif path.suffix == ".gguf":
        loaded = _load_gguf(path, dtype)
    else:
        raise ModelLoadError(f"{path} is neither a Hugging Face model folder nor a .gguf file")
    return loaded if keep_quantized else loaded.dequantized(dtype)


def _check_shapes(
    found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], where, implied_by: str
):
    """`where(name)` names the file holding a tensor, for the error message."""
    for name, shape in expected.items():
        if name not in found:
            raise ModelLoadError(f"{where(name)} has no tensor {name!r}, which {implied_by} requires")
        if tuple(found[name]) != shape:
            raise ModelLoadError(
                f"tensor {name!r} in {where(name)} has shape {list(found[name])}, "
                f"but {implied_by} implies {list(shape)}"
            )


# ---- Hugging Face folders -------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e}); fix or download the file again") from e


def config_from_hf(
    raw: dict[str, Any], source: Path, generation: dict[str, Any] | None = None
) -> ModelConfig:
    architectures = raw.get("architectures") or [raw.get("model_type", "unknown")]
    # A sequence classifier's body is its causal LM's (the head: contract/pooling.classifier_of).
    causal = [causal_architecture(a) for a in architectures]
    architecture = next((a for a in causal if a in HF_ARCHITECTURES), None)
    if architecture is None:
        raise ModelLoadError(
            f"{source} is a {', '.join(architectures)} model; Pagoda supports {', '.join(HF_ARCHITECTURES)}"
        )
    try:
        config = HF_ARCHITECTURES[architecture].config_from_hf(raw, architecture)
    except ConfigError as e:
        raise ModelLoadError(f"{source} {e}") from e
    except ValueError as e:  # a shape no model has (ModelArchitecture's own checks)
        raise ModelLoadError(f"{source} describes a model Pagoda cannot build: {e}") from e
    eos = (generation or {}).get("eos_token_id", raw.get("eos_token_id"))
    try:
        matryoshka, classifier = matryoshka_of(raw), classifier_of(raw)
    except ValueError as e:
        raise ModelLoadError(f"{source}: {e}") from e
    return replace(
        config,
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        matryoshka=matryoshka,
        classifier=classifier,
    )


def _safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header, checking that the file holds all the bytes it promises."""
    if not file.is_file():
        raise ModelLoadError(f"weight file {file} is missing; download the model again")
    size = file.stat().st_size
    with open(file, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ModelLoadError(f"{file} is truncated: expected at least 8 bytes but the file has {size}")
        header_size = struct.unpack("<Q", prefix)[0]
        if 8 + header_size > size:
            raise ModelLoadError(
                f"{file} is truncated: expected a {header_size}-byte safetensors header "
                f"but the file has {size} bytes"
            )
        try:
            header = json.loads(f.read(header_size))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{file} is not a safetensors file: its header is not JSON ({e})") from e
    header.pop("__metadata__", None)
    data_end = 8 + header_size + max((t["data_offsets"][1] for t in header.values()), default=0)
    if data_end > size:
        raise ModelLoadError(
            f"{file} is truncated: its header describes {data_end} bytes but the file has {size}; "
            "download it again"
        )
    return {name: tuple(t["shape"]) for name, t in header.items()}


def _weight_files(folder: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map", {})
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise ModelLoadError(
            f"{folder} has neither model.safetensors nor model.safetensors.index.json; "
            "Pagoda loads weights from safetensors files"
        )
    return dict.fromkeys(_safetensors_shapes(single), single)


def read_float_tensor(folder: Path, name: str) -> torch.Tensor | None:
    """One tensor of a Hugging Face folder in float32 (a classifier's head); None where it has none."""
    file = _weight_files(folder).get(name)
    if file is None:
        return None
    with safe_open(str(file), framework="pt") as opened:
        return opened.get_tensor(name).float()


def _checkpoint_quantization(raw: dict[str, Any], config_file: Path) -> CheckpointQuantization | None:
    try:
        return parse_quantization_config(raw)
    except ValueError as e:
        raise ModelLoadError(f"{config_file}: {e}") from e


def _stored_projections(
    expected: dict[str, tuple[int, ...]],
    found: dict[str, tuple[int, ...]],
    spec: CheckpointQuantization | None,
    file_of: dict[str, Path],
) -> dict[str, dict[str, tuple[int, ...]]]:
    """For each projection stored quantized: its stored tensors' names and the shapes they must have."""
    quantized = {name.removesuffix(".qweight") + ".weight" for name in found if name.endswith(".qweight")}
    if quantized and spec is None:
        name = min(quantized).removesuffix(".weight") + ".qweight"
        raise ModelLoadError(
            f"{file_of[name]} holds the packed tensor {name!r} but config.json has no quantization_config; "
            "restore the config.json the checkpoint was exported with"
        )
    stray = sorted(name for name in quantized if name not in expected or not is_projection(name))
    if stray:
        raise ModelLoadError(
            f"{file_of[stray[0].removesuffix('.weight') + '.qweight']} stores {stray[0]!r} quantized; "
            "Pagoda loads AWQ and GPTQ quantization of the decoder projections only"
        )
    stored = {}
    for name in sorted(quantized):
        prefix = name.removesuffix("weight")
        shapes = {prefix + part: shape for part, shape in stored_shapes(spec, *expected[name]).items()}
        if spec.method == "gptq" and prefix + "g_idx" not in found:
            del shapes[prefix + "g_idx"]  # optional: without it the groups are in input order
        stored[name] = shapes
    return stored


def load_mtp_layer(
    path: str | Path, dtype: torch.dtype = torch.float32, hf_overrides: dict[str, Any] | None = None
) -> LoadedModel:
    """The first multi-token-prediction layer of the Hugging Face folder `path` (mtp_head.py's
    tensors, quantized projections as PackedWeights), with the model's config and tokenizer;
    hf_overrides as load_model_source's. ModelLoadError where there is none to read."""
    path = resolve_model(str(path))
    if not path.is_dir():
        raise ModelLoadError(
            f"{path} is not a Hugging Face model folder; the mtp method reads the folder's "
            "multi-token-prediction layer, which GGUF files and the bundled model do not hold"
        )
    return _load_hf_folder(path, dtype, hf_overrides or {}, mtp_weight_shapes)


def _load_hf_folder(
    folder: Path,
    dtype: torch.dtype,
    overrides: dict[str, Any],
    shapes: Callable[[ModelConfig], dict[str, tuple[int, ...]]] = weight_shapes,
) -> LoadedModel:
    """`shapes`: the tensors read, by Hugging Face name, of the folder's config (the model's, or its
    MTP layer's)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{folder} has no config.json; expected a Hugging Face model folder")
    generation_file = folder / "generation_config.json"
    generation = _read_json(generation_file) if generation_file.is_file() else None
    raw = {**_read_json(config_file), **overrides}
    if "rope_scaling" in overrides and "rope_parameters" not in overrides:
        # transformers 5 folders keep their scaling in rope_parameters too: the override's replaces it.
        kept = ("rope_theta", "partial_rotary_factor")
        raw["rope_parameters"] = {k: v for k, v in (raw.get("rope_parameters") or {}).items() if k in kept}
    wrapped = wrapped_text_architecture(raw)
    if wrapped is not None:
        raw = text_config(raw)
    config = config_from_hf(raw, config_file, generation)
    mxfp4_experts = mxfp4.is_mxfp4(raw)
    try:
        fp8_block = fp8_blocks.block_size(raw)
        compressed = compressed_tensors.scheme_of(raw)
    except (fp8_blocks.Fp8CheckpointError, compressed_tensors.CompressedTensorsError) as e:
        raise ModelLoadError(f"{config_file}: {e}") from e
    read_apart = mxfp4_experts or fp8_block or compressed
    spec = None if read_apart else _checkpoint_quantization(raw, config_file)
    tokenizer = Tokenizer.from_folder(folder, config.eos_token_ids)
    config = replace(config, eos_token_ids=tokenizer.eos_token_ids)

    file_of = _weight_files(folder)
    found: dict[str, tuple[int, ...]] = {}
    for file in dict.fromkeys(file_of.values()):
        found.update(_safetensors_shapes(file))
    stored_as = {name: name for name in file_of}  # the name the model reads -> the name in the file
    if wrapped is not None:
        stored_as = {text_tensor_name(n): n for n in file_of if text_tensor_name(n) is not None}
        file_of = {name: file_of[original] for name, original in stored_as.items()}
        found = {name: found[original] for name, original in stored_as.items()}
    expected = shapes(config)
    if config.classifier is not None and "lm_head.weight" in expected and "lm_head.weight" not in found:
        # A classifier checkpoint keeps its score head instead of an LM head. The one hidden token
        # that ends each pooled run (engine/pooler.py) is then read off the tied embedding: never
        # shown, so any logits do.
        config = replace(config, architecture=replace(config.architecture, tie_word_embeddings=True))
        expected = shapes(config)
    stored = _stored_projections(expected, found, spec, file_of)
    # MXFP4 tensors: those of the float layout the file holds as blocks and scales instead.
    mx = {}
    if mxfp4_experts:
        mx = {
            name: mxfp4.stored_parts(name, shape)
            for name, shape in expected.items()
            if name not in found and f"{name}_blocks" in found
        }
    # compressed-tensors projections: their stored tensors, by the float weight's name.
    ct = {}
    if compressed:
        ct = {
            name: compressed.parts(name, shape, found)
            for name, shape in expected.items()
            if compressed.stores(name, found)
        }
    apart = {**mx, **ct}
    required = {name: shape for name, shape in expected.items() if name not in stored and name not in apart}
    for shapes in (*stored.values(), *apart.values()):
        required.update(shapes)
    # Block-FP8 projections: those whose weight has its block scales beside it (the router, the
    # embedding and the LM head stay float).
    fp8 = {}
    if fp8_block:
        fp8 = {name: fp8_blocks.scale_name(name) for name in expected if fp8_blocks.scale_name(name) in found}
        required.update({fp8[name]: fp8_blocks.scale_shape(expected[name], fp8_block) for name in fp8})
    _check_shapes(found, required, lambda name: file_of.get(name, folder), f"{config_file}")

    def weights() -> Iterator[tuple[str, Weight]]:
        with contextlib.ExitStack() as files:
            opened = {}

            def read(name: str) -> torch.Tensor:
                file = file_of[name]
                if file not in opened:
                    opened[file] = files.enter_context(safe_open(file, framework="pt"))
                return opened[file].get_tensor(stored_as[name])

            for name in expected:
                if name in stored:
                    # A projection's parts may sit in different shards.
                    yield name, to_packed(spec, {part.rsplit(".", 1)[1]: read(part) for part in stored[name]})
                elif name in mx:
                    yield name, mxfp4.dequantize(read(f"{name}_blocks"), read(f"{name}_scales"), dtype)
                elif name in ct:
                    weight = compressed.load(name, {part: read(part) for part in ct[name]}, dtype)
                    if isinstance(weight, PackedWeight) and not is_projection(name):
                        # Only the decoder's projections run packed (a router quantized too is rare).
                        weight = dequantize(weight, dtype)
                    yield name, weight
                elif name in fp8:
                    yield name, fp8_blocks.dequantize(read(name), read(fp8[name]), fp8_block, dtype)
                else:
                    yield name, read(name).to(dtype)

    defaults = sampling_defaults(generation or {})
    if ct:
        group_size = compressed.group_size or -1 if compressed.kind == "int4" else None
        return LoadedModel(
            config,
            weights(),
            tokenizer,
            compressed.stored,
            group_size=group_size,
            sampling_defaults=defaults,
            folder=folder,
        )
    if not stored:
        # A block-FP8 checkpoint's floats are reported as stored fp8, which auto holds as fp8 again.
        held = "fp8" if fp8 else None
        return LoadedModel(config, weights(), tokenizer, held, sampling_defaults=defaults, folder=folder)
    return LoadedModel(
        config,
        weights(),
        tokenizer,
        spec.method,
        group_size=spec.group_size,
        sampling_defaults=defaults,
        folder=folder,
    )


def sampling_defaults(generation: dict[str, Any]) -> dict[str, float]:
    """The request defaults a generation_config.json recommends: its numbers for
    MODEL_DEFAULTED_FIELDS (do_sample is not read, as vLLM does not read it)."""
    defaults = {}
    for name in MODEL_DEFAULTED_FIELDS:
        value = generation.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            defaults[name] = value
    return defaults


# ---- GGUF files -----------------------------------------------------------------------------------


def config_from_gguf(gguf: GGUFFile, tokenizer: Tokenizer) -> ModelConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{gguf.path} holds a {arch!r} model; Pagoda reads GGUF files of {', '.join(GGUF_ARCHITECTURES)}"
        )
    try:
        config = GGUF_ARCHITECTURES[arch].gguf.config(arch, meta, set(gguf.tensors), gguf.dequantize)
    except ConfigError as e:
        raise ModelLoadError(f"{gguf.path} {e}") from e
    except KeyError as e:
        raise ModelLoadError(
            f"{gguf.path} lacks the metadata key {e.args[0]!r} that a {arch} model needs"
        ) from e
    return replace(config, eos_token_ids=tokenizer.eos_token_ids)


def hf_name_of_gguf(name: str, layer_names: dict[str, str]) -> str | None:
    """The Hugging Face name of GGUF tensor `name`; layer_names: the family's per-layer names. The
    name of a tensor holding every expert of a layer has {} where the expert's index goes."""
    if name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}"
    return None


def unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter, which reorders each head's q/k rows from HF's rotate-half layout
    to the interleaved pairs its RoPE expects; works for weights [rows, cols] and biases [rows]."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def _gguf_sources(gguf: GGUFFile, layer_names: dict[str, str]) -> dict[str, tuple[str, int | None]]:
    """Hugging Face name -> (the GGUF tensor holding it, its expert's index in a merged tensor)."""
    sources = {}
    for name, info in gguf.tensors.items():
        hf = hf_name_of_gguf(name, layer_names)
        if hf is not None and "{}" in hf:
            sources |= {hf.format(e): (name, e) for e in range(info.shape[0])}
        elif hf is not None:
            sources[hf] = (name, None)
    return sources


def _load_gguf(path: Path, dtype: torch.dtype) -> LoadedModel:
    gguf = GGUFFile(path)
    tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata, str(path))
    config = config_from_gguf(gguf, tokenizer)
    layout = family_of(config).gguf
    sources = _gguf_sources(gguf, _GGUF_LAYER_NAMES | layout.layer_names)
    found = {
        hf: gguf.tensors[name].shape[1:] if expert is not None else gguf.tensors[name].shape
        for hf, (name, expert) in sources.items()
    }
    expected = weight_shapes(config)
    _check_shapes(found, expected, lambda name: path, f"the {config.model_type} metadata of {path}")
    packed = {
        hf for hf in expected if is_projection(hf) and is_packable(gguf.tensors[sources[hf][0]].ggml_type)
    }
    permuted_heads = {}
    if gguf.metadata["general.architecture"] in layout.permuted_qk:
        permuted_heads = {".self_attn.q_proj.": config.architecture.num_attention_heads}
        permuted_heads[".self_attn.k_proj."] = config.architecture.num_key_value_heads
    transform = layout.tensor or (lambda hf, tensor: tensor)

    def whole(name: str, keep_packed: bool) -> Weight:
        info = gguf.tensors[name]
        if not keep_packed:
            return gguf.dequantize(name)
        rows = info.num_elements // info.shape[-1]
        return gguf_to_packed(gguf.raw_bytes(name), info.ggml_type, (rows, info.shape[-1]))

    def weights(packed: set[str] = packed, dtype: torch.dtype = dtype) -> Iterator[tuple[str, Weight]]:
        merged: dict[str, Weight] = {}  # the merged expert tensors of the layer being read
        for hf in expected:
            name, expert = sources[hf]
            if expert is None:
                weight = whole(name, hf in packed)
            else:
                if name not in merged:
                    layer = name.rsplit(".", 2)[0]
                    merged = {n: w for n, w in merged.items() if n.startswith(layer + ".")}
                    merged[name] = whole(name, hf in packed)
                weight = merged[name]
                rows = gguf.tensors[name].shape[1]
                weight = (
                    weight.rows(slice(expert * rows, (expert + 1) * rows)) if hf in packed else weight[expert]
                )
            heads = next((n for part, n in permuted_heads.items() if part in hf), None)
            if hf in packed:
                # Whole rows move, so the blocks are un-permuted without touching their values.
                order = unpermute_rotary(torch.arange(weight.out_features), heads) if heads else None
                yield hf, weight if order is None else weight.rows(order)
            else:
                yield hf, transform(hf, (unpermute_rotary(weight, heads) if heads else weight).to(dtype))

    # Each expert of a merged tensor counts with its own elements.
    main = gguf_main_type(
        {
            hf: (gguf.tensors[sources[hf][0]].ggml_type, math.prod(found[hf]))
            for hf in expected
            if is_projection(hf)
        }
    )
    if main is None:
        return LoadedModel(config, weights(), tokenizer)
    file_type = gguf_file_type(str(path), main)
    return LoadedModel(config, weights(), tokenizer, "gguf", file_type, float_weights=partial(weights, set()))
