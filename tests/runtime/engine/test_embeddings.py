"""--runner pooling: each prompt's final hidden states pooled into its embedding as
sentence-transformers pools them (LAST, MEAN or CLS over transformers' last_hidden_state,
normalized where the folder's Normalize module or --pooler-config says), whatever the batching does:
prompts split over steps, several in a step, sequences preempted and recomputed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.pooling import PoolerConfig, PoolingParams
from pagoda_runtime.engine.pooler import Pooler
from pagoda_runtime.engine.request_validation import RequestRejected
from pagoda_runtime.engine.scheduler import ScheduledBatch
from pagoda_runtime.loading.sentence_transformers import PoolingConfigError
from transformers import AutoModel

from tests.runtime.tiny_models import build_tiny_model

PROMPTS = [
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b",
    "1",
    "The quick brown fox jumps over the lazy dog. " * 3,
]
MODES = {
    "LAST": "pooling_mode_lasttoken",
    "MEAN": "pooling_mode_mean_tokens",
    "CLS": "pooling_mode_cls_token",
}


def sentence_transformers_folder(tmp_path, kind: str | None, normalize: bool, variant: str = "qwen3"):
    """A tiny model folder with the modules.json (and Pooling config) sentence-transformers writes."""
    folder = build_tiny_model(tmp_path / variant, variant)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    if kind is not None:
        (folder / "1_Pooling").mkdir()
        flags = {flag: flag == MODES.get(kind, kind) for flag in (*MODES.values(), "pooling_mode_max_tokens")}
        (folder / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 64, **flags})
        )
        modules.append(
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
        )
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def expected(folder, token_ids: list[int], kind: str, normalize: bool) -> torch.Tensor:
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([token_ids])).last_hidden_state[0]
    vector = {"LAST": hidden[-1], "MEAN": hidden.mean(dim=0), "CLS": hidden[0]}[kind]
    return torch.nn.functional.normalize(vector, dim=0) if normalize else vector


def embed(folder, **engine) -> list:
    llm = LLM(str(folder), dtype="float32", device="cpu", runner="pooling", block_size=4, **engine)
    return llm.embed(PROMPTS)


@pytest.mark.parametrize(("kind", "normalize"), [("LAST", True), ("MEAN", False), ("CLS", True)])
def test_the_folders_pooling_is_transformers_hidden_states_pooled(tmp_path, kind, normalize):
    folder = sentence_transformers_folder(tmp_path, kind, normalize)
    # A budget of 7 tokens a step: the longer prompts are split, the short ones share steps.
    for out in embed(folder, max_num_batched_tokens=7):
        vector = torch.tensor(out.outputs.embedding)
        reference = expected(folder, out.prompt_token_ids, kind, normalize)
        torch.testing.assert_close(vector, reference, rtol=1e-4, atol=1e-5)
        assert abs(float(vector.norm()) - 1.0) < 1e-5 if normalize else abs(float(vector.norm()) - 1.0) > 0.01


def test_pooler_config_overrides_the_folder_and_the_default_is_the_last_token_normalized(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "LAST", True)
    overridden = embed(folder, pooler_config={"pooling_type": "mean", "normalize": False})
    for out in overridden:
        reference = expected(folder, out.prompt_token_ids, "MEAN", False)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), reference, rtol=1e-4, atol=1e-5)
    (folder / "modules.json").unlink()
    for out in embed(folder):
        reference = expected(folder, out.prompt_token_ids, "LAST", True)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), reference, rtol=1e-4, atol=1e-5)


def test_a_cache_too_small_for_all_prompts_at_once_queues_them_and_refuses_one_too_long(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "MEAN", False)
    probe = LLM(str(folder), dtype="float32", device="cpu", runner="pooling", block_size=4)
    cache = probe.engine.runner.kv_caches[0]
    layer_block = cache[0, 0].numel() * 2 * cache.element_size()
    layers = len(probe.engine.runner.kv_caches)
    # Room for the longest prompt alone, not for all four at once: 20 blocks of 4 tokens.
    llm = LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        runner="pooling",
        block_size=4,
        max_num_batched_tokens=16,
        kv_cache_memory=20 * layer_block * layers,
    )
    for out in llm.embed(PROMPTS):
        reference = expected(folder, out.prompt_token_ids, "MEAN", False)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), reference, rtol=1e-4, atol=1e-5)
    # One token of the context is the run's own (the greedy token that ends it, never shown).
    with pytest.raises(RequestRejected, match="embeds at most 79 tokens .* but the prompt has 144"):
        llm.embed(PROMPTS[-1] * 2)


def test_a_sequence_recomputed_from_its_first_token_pools_its_recompute_alone():
    """Preemption by recompute runs a prompt again from token 0: the sum starts over."""
    pooler = Pooler(PoolerConfig("MEAN", False))
    seq = SimpleNamespace(seq_id=7, num_computed_tokens=0, num_prompt_tokens=4)
    first = torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    pooler.record(ScheduledBatch([seq], [2]), first)  # the first chunk, then preempted
    pooler.record(ScheduledBatch([seq], [2]), first)  # recomputed from token 0
    seq.num_computed_tokens = 2
    pooler.record(ScheduledBatch([seq], [3]), torch.tensor([[5.0, 2.0], [7.0, 2.0], [99.0, 99.0]]))
    # The token after the prompt (99) is not the prompt's.
    assert pooler.pop(seq, PoolingParams()) == [4.0, 1.0]


def test_an_embedding_engine_generates_nothing_and_a_generating_one_embeds_nothing(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "LAST", True)
    pooling = LLM(str(folder), dtype="float32", device="cpu", runner="pooling")
    with pytest.raises(RequestRejected, match="embeds prompts .* use /v1/embeddings"):
        pooling.generate(["Hello"], SamplingParams(max_tokens=3))
    generating = LLM(str(folder), dtype="float32", device="cpu")
    with pytest.raises(RequestRejected, match="need one started with --runner pooling"):
        generating.embed(["Hello"])


def test_settings_pooling_cannot_serve_are_refused_in_one_sentence(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "pooling_mode_max_tokens", False)
    with pytest.raises(PoolingConfigError, match="1_Pooling/config.json pools by pooling_mode_max_tokens"):
        LLM(str(folder), dtype="float32", device="cpu", runner="pooling")
    # --pooler-config's pooling_type replaces what the folder asks for.
    llm = LLM(
        str(folder), dtype="float32", device="cpu", runner="pooling", pooler_config={"pooling_type": "CLS"}
    )
    assert len(llm.embed("Hello")[0].outputs.embedding) == 64
    with pytest.raises(ValueError, match="--pooler-config applies to --runner pooling"):
        LLM(str(folder), dtype="float32", device="cpu", pooler_config={"pooling_type": "CLS"})
    with pytest.raises(ValueError, match="pooling_type 'MAX' is not one Pagoda pools by"):
        LLM(
            str(folder),
            dtype="float32",
            device="cpu",
            runner="pooling",
            pooler_config={"pooling_type": "max"},
        )
    with pytest.raises(ValueError, match="--pooler-config has dimensions, which Pagoda does not read"):
        LLM(str(folder), dtype="float32", device="cpu", runner="pooling", pooler_config={"dimensions": 8})
    with pytest.raises(ValueError, match="drop --speculative-config"):
        LLM(
            str(folder),
            dtype="float32",
            device="cpu",
            runner="pooling",
            speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
        )


@pytest.mark.parametrize("normalize", [True, False])
def test_a_matryoshka_model_cuts_its_embeddings_then_normalizes_them(tmp_path, normalize):
    """The first `dimensions` values of the pooled state, scaled to unit length where the model
    normalizes: what sentence-transformers' truncate_dim gives."""
    folder = sentence_transformers_folder(tmp_path, "MEAN", normalize)
    llm = LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        runner="pooling",
        hf_overrides={"is_matryoshka": True},
    )
    cuts = [PoolingParams(dimensions=d) for d in (8, 64, 1, None)]
    outs = llm.embed(PROMPTS, pooling_params=cuts)
    for out, params in zip(outs, cuts, strict=True):
        full = expected(folder, out.prompt_token_ids, "MEAN", False)[: params.dimensions]
        reference = torch.nn.functional.normalize(full, dim=0) if normalize else full
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), reference, rtol=1e-4, atol=1e-5)
    assert [len(out.outputs.embedding) for out in outs] == [8, 64, 1, 64]


def test_dimensions_a_model_was_not_trained_at_are_refused_naming_the_sizes(tmp_path):
    folder = sentence_transformers_folder(tmp_path, "LAST", True)
    plain = LLM(str(folder), dtype="float32", device="cpu", runner="pooling")
    with pytest.raises(RequestRejected, match="not trained to serve shorter embeddings") as refused:
        plain.embed("Hello", pooling_params=PoolingParams(dimensions=8))
    assert refused.value.param == "dimensions"
    listed = LLM(
        str(folder),
        dtype="float32",
        device="cpu",
        runner="pooling",
        hf_overrides={"matryoshka_dimensions": [16, 32]},
    )
    assert len(listed.embed("Hello", pooling_params=PoolingParams(dimensions=16))[0].outputs.embedding) == 16
    with pytest.raises(RequestRejected, match="dimensions 24 is not a size .* use one of 16, 32"):
        listed.embed("Hello", pooling_params=PoolingParams(dimensions=24))
    open_ended = LLM(
        str(folder), dtype="float32", device="cpu", runner="pooling", hf_overrides={"is_matryoshka": True}
    )
    for wrong in (0, 65):
        with pytest.raises(RequestRejected, match=f"between 1 and the model's 64, not {wrong}"):
            open_ended.embed("Hello", pooling_params=PoolingParams(dimensions=wrong))
    with pytest.raises(ValueError, match="matryoshka_dimensions must be a list of positive integers"):
        LLM(
            str(folder),
            dtype="float32",
            device="cpu",
            runner="pooling",
            hf_overrides={"matryoshka_dimensions": "16"},
        )


@pytest.mark.gpu
def test_embeddings_on_the_gpu_match_the_cpus(tmp_path):
    """The Triton kernels and CUDA graphs of a GPU engine, in bfloat16, pool the states the CPU's
    float32 reference pools, to bfloat16's precision."""
    folder = sentence_transformers_folder(tmp_path, "MEAN", True)
    gpu = LLM(str(folder), dtype="bfloat16", device="cuda", runner="pooling", max_num_batched_tokens=16)
    for out in gpu.embed(PROMPTS):
        reference = expected(folder, out.prompt_token_ids, "MEAN", True)
        assert (
            float(
                torch.nn.functional.cosine_similarity(torch.tensor(out.outputs.embedding), reference, dim=0)
            )
            > 0.99
        )


def test_the_serve_flags_are_vllms(capsys):
    from pagoda_runtime import cli

    args = cli.parser().parse_args(
        ["serve", "--runner", "pooling", "--pooler-config", '{"pooling_type": "cls"}']
    )
    config = cli.engine_config(args)
    assert config.pooling and config.pooler_config == PoolerConfig("CLS", None)
    assert not config.enable_prefix_caching  # a cached prefix would not be run, nor pooled
    for wrong in (["--runner", "embed"], ["--runner", "pooling", "--pooler-config", "{mean"]):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(["serve", *wrong])
    assert "--pooler-config is not valid JSON" in capsys.readouterr().err
