"""LoRA adapters in the engine: each adapter's greedy tokens equal transformers' with the adapter
merged into the weights (float32, tiny random models of two families), whether a step mixes it with
other adapters and the base model or runs it alone; adapters swapped through fewer device slots
than adapters, least recently used first; an adapter unloaded while a request runs with it; and the
adapters that cannot run on the model refused with a sentence saying why."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.engine.protocol import LoraAdapterError, ServedLora
from pagoda_runtime.engine.request_validation import RequestRejected
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup
from pagoda_runtime.executor.kernels.lora_slots import lora_batch
from pagoda_runtime.loading.lora_adapter import load_lora_adapter
from pagoda_runtime.parallel.tensor_parallel import SINGLE_PROCESS

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.engine.tensor_parallel_jobs import lora_runs
from tests.runtime.tensor_parallel_ranks import run_on_ranks
from tests.runtime.tiny_lora import build_tiny_adapter, merged_reference
from tests.runtime.tiny_models import build_tiny_model

NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROMPTS = ["Hello, world! How are", "The quick brown fox jumps over the lazy dog. She"]
# name -> (rank, targets, rslora)
ADAPTERS = {
    "full8": (8, None, False),
    "rs16": (16, None, True),
    "qv4": (4, ("q_proj", "v_proj"), False),
}


def _engine_kwargs(**extra):
    return dict(dtype="float32", device="cpu", block_size=4, kv_cache_memory=2**22, **extra)


# granite: its residual multiplier scales o_proj and down_proj outputs, adapters included.
@pytest.fixture(scope="module", params=["llama3", "qwen3", "granite"])
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    base = build_tiny_model(root / "base", request.param)
    adapters = {}
    for seed, (name, (rank, targets, rslora)) in enumerate(ADAPTERS.items()):
        extra = {"targets": targets} if targets else {}
        adapters[name] = build_tiny_adapter(
            root / name, base, rank, seed, rslora=rslora, alpha=2 * rank, **extra
        )
    references = {name: merged_reference(base, adapters.get(name)) for name in (None, *adapters)}
    return base, adapters, _Expected(references)


class _Expected:
    """transformers' greedy tokens with an adapter merged, each computed once per module."""

    def __init__(self, references):
        self.references = references
        self.tokens = {}

    def __call__(self, name, ids):
        key = (name, tuple(ids))
        if key not in self.tokens:
            self.tokens[key] = hf_greedy(self.references[name], ids, NEW_TOKENS)
        return self.tokens[key]


def _llm(base, adapters, **extra):
    llm = LLM(model=str(base), **_engine_kwargs(enable_lora=True, max_lora_rank=16, **extra))
    for name, folder in adapters.items():
        llm.add_lora(name, str(folder))
    return llm


def _expected(expected, llm, name, prompt):
    return expected(name, llm.get_tokenizer().encode(prompt))


def test_each_adapter_alone_and_mixed_matches_merged_transformers(family):
    base, adapters, models = family
    llm = _llm(base, adapters, max_loras=3)
    names = [None, *adapters]
    alone = {
        name: [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, lora_name=name)]
        for name in names
    }
    for name in names:
        assert alone[name] == [_expected(models, llm, name, p) for p in PROMPTS], name
    # Every adapter changes the output, so a delta dropped or applied to the wrong tokens shows.
    assert all(alone[name] != alone[None] for name in adapters)
    # One batch: every prompt with every adapter and with the base model, the same prompts sharing
    # prefix blocks within an adapter only.
    mixed = llm.generate(
        [p for _ in names for p in PROMPTS], GREEDY, lora_name=[n for n in names for _ in PROMPTS]
    )
    tokens = [o.outputs[0].token_ids for o in mixed]
    assert tokens == [t for name in names for t in alone[name]]


def test_fewer_slots_than_adapters_swaps_least_recently_used(family):
    base, adapters, models = family
    llm = _llm(base, adapters, max_loras=1, max_cpu_loras=2)
    loras = llm.engine.loras
    names = list(adapters)
    outputs = llm.generate([PROMPTS[0]] * 3, GREEDY, lora_name=names)
    assert [o.outputs[0].token_ids for o in outputs] == [_expected(models, llm, n, PROMPTS[0]) for n in names]
    # One slot, three adapters: each was swapped in, and one of them read again from its folder
    # since host memory holds two.
    assert loras.num_swaps >= 3 and loras.num_reads >= 4
    assert len(loras.resident) == 1
    llm.generate(PROMPTS[0], GREEDY, lora_name=names[0])
    assert loras.resident == [names[0]]


def test_least_recently_used_slot_is_swapped_out(family):
    base, adapters, _ = family
    llm = _llm(base, adapters, max_loras=2)
    loras = llm.engine.loras
    a, b, c = adapters
    for name in (a, b, a, c):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=1), lora_name=name)
    assert loras.resident == [a, c]  # b was the least recently used when c came


def test_unload_waits_for_running_requests(family):
    base, adapters, models = family
    llm = _llm(base, adapters, max_loras=1)
    engine = llm.engine
    name = next(iter(adapters))
    engine.add(engine.make_request("r", PROMPTS[0], GREEDY, lora_name=name))
    engine.step()
    llm.remove_lora(name)
    assert name not in engine.lora_adapters()
    with pytest.raises(RequestRejected, match="not loaded"):
        engine.make_request("other", PROMPTS[0], GREEDY, lora_name=name)
    with pytest.raises(LoraAdapterError, match="being unloaded"):
        llm.add_lora(name, str(adapters[name]))
    final = None
    while engine.has_unfinished():
        for output in engine.step():
            final = output
    assert final.outputs[0].token_ids == _expected(models, llm, name, PROMPTS[0])
    llm.add_lora(name, str(adapters[name]))  # gone once its request ended: the name is free again
    assert name in engine.lora_adapters()


def test_unknown_adapter_name_is_rejected(family):
    base, adapters, _ = family
    llm = _llm(base, {})
    with pytest.raises(RequestRejected, match="'nope' is not loaded"):
        llm.generate(PROMPTS[0], GREEDY, lora_name="nope")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (dict(rank=32), "rank 32, above --max-lora-rank 16"),
        (dict(hidden_size=96), "trained for another base model"),
        (dict(config_overrides={"use_dora": True}), "use_dora"),
        (dict(config_overrides={"peft_type": "IA3"}), "LoRA adapters only"),
    ],
)
def test_adapters_that_do_not_fit_are_refused(family, tmp_path, build, message):
    base, _, _ = family
    llm = _llm(base, {})
    folder = build_tiny_adapter(tmp_path / "bad", base, **{"rank": 4, "seed": 0, **build})
    with pytest.raises(LoraAdapterError, match=message):
        llm.add_lora("bad", str(folder))
    assert llm.engine.lora_adapters() == {}


def test_missing_folder_and_foreign_tensors_are_refused(family, tmp_path):
    base, _, _ = family
    llm = _llm(base, {})
    with pytest.raises(LoraAdapterError, match="holds no adapter_config.json"):
        llm.add_lora("missing", str(tmp_path / "nowhere"))
    folder = build_tiny_adapter(tmp_path / "embed", base, rank=4, seed=0)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "adapter_model.safetensors")
    tensors["base_model.model.lm_head.lora_A.weight"] = tensors[next(iter(tensors))].clone()
    save_file(tensors, folder / "adapter_model.safetensors")
    with pytest.raises(LoraAdapterError, match="lm_head"):
        llm.add_lora("embed", str(folder))


def test_lora_modules_at_start_up(family):
    base, adapters, _ = family
    name, folder = next(iter(adapters.items()))
    llm = LLM(
        model=str(base),
        **_engine_kwargs(enable_lora=True, lora_modules=(f"{name}={folder}",), max_lora_rank=16),
    )
    assert llm.engine.lora_adapters() == {name: ServedLora(None, str(folder))}
    with pytest.raises(LoraAdapterError, match="above --max-lora-rank 4"):
        LLM(
            model=str(base),
            **_engine_kwargs(enable_lora=True, lora_modules=(f"{name}={folder}",), max_lora_rank=4),
        )
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        LLM(model=str(base), **_engine_kwargs(lora_modules=(f"{name}={folder}",)))


def test_prefix_cache_is_keyed_by_adapter(family):
    base, adapters, expected = family
    llm = _llm(base, adapters, max_loras=3)
    block_manager = llm.engine.block_manager
    prompt = PROMPTS[1]  # several full blocks of 4 tokens
    names = [None, "full8", "full8", "rs16", None]
    hits = []
    for name in names:
        before = block_manager.prefix_hits
        output = llm.generate(prompt, GREEDY, lora_name=name)[0]
        hits.append(block_manager.prefix_hits - before)
        assert output.outputs[0].token_ids == _expected(expected, llm, name, prompt), name
    # Only a request with the same adapter as an earlier one (or the base model again) reuses blocks.
    assert hits[0] == hits[1] == hits[3] == 0 and hits[2] > 0 and hits[4] > 0


def test_quantized_base_takes_the_delta_on_its_output(family):
    base, adapters, _ = family
    llm = _llm(base, {"full8": adapters["full8"]}, quantization="int8")
    engine = llm.engine
    attn = engine.runner.model.layers[0].self_attn
    assert type(attn.qkv_proj).__name__ == "QuantizedLinear"
    lora = engine.loras.acquire("full8")
    slot = engine.loras.slots_for([_seq_with(lora)])[0]
    adapter = load_lora_adapter("full8", adapters["full8"], engine.model_config, 16)
    a, b = adapter.weights[(0, "q_proj")]
    x = torch.randn(3, attn.qkv_proj.in_features)
    slots = engine.runner.lora_slots
    base_out = attn.qkv_proj(x)
    slots.batch = lora_batch(torch.tensor([slot, -1, slot], dtype=torch.int32), slots.num_slots)
    try:
        out = attn.qkv_lora(base_out.clone(), x)
    finally:
        slots.batch = None
    delta = adapter.scaling * (x @ a.t() @ b.t())
    torch.testing.assert_close(out[[0, 2], : attn.q_size], base_out[[0, 2], : attn.q_size] + delta[[0, 2]])
    torch.testing.assert_close(out[1], base_out[1])  # the base model's token is left alone


def _seq_with(lora):
    group = SequenceGroup("q", [1], SamplingParams(), 0.0, lora=lora)
    return Sequence(group, 0)


@pytest.mark.slow
def test_two_tensor_parallel_ranks_give_the_tokens_of_one_process(tmp_path):
    """GQA (8 query heads on 2 KV heads), float32 and int8 base weights: each rank keeps its rows of
    B for q/k/v and gate/up and its columns of A for o and down; one slot for two adapters, each
    loaded live, so each swap reaches the other rank between steps."""
    base = build_tiny_model(tmp_path / "gqa", "gqa")
    adapters = {
        "all8": str(build_tiny_adapter(tmp_path / "all8", base, 8, seed=1)),
        "attn4": str(
            build_tiny_adapter(
                tmp_path / "attn4", base, 4, seed=2, targets=("q_proj", "k_proj", "v_proj", "o_proj")
            )
        ),
    }
    settings = dict(block_size=4, kv_cache_memory=2**22, max_loras=1, max_lora_rank=8)
    # int8: o_proj's and down_proj's packed columns cut like A's.
    jobs = {"float32": settings, "int8": {**settings, "quantization": "int8"}}
    whole = lora_runs(SINGLE_PROCESS, str(base), adapters, jobs)
    split = run_on_ranks(2, lora_runs, str(base), adapters, jobs)
    for job, run in whole.items():
        assert split[job]["ids"] == run["ids"], job
        assert run["ids"]["all8"] != run["ids"][None] != run["ids"]["attn4"] != run["ids"]["all8"], job
        assert split[job]["swaps"] == run["swaps"] >= 2, job


@pytest.mark.gpu
def test_adapters_on_the_gpu_match_merged_transformers(family):
    """The Triton shrink and expand kernels in the model, float32 on CUDA, mixed with the base; the
    decode steps replay the CUDA graphs (8 sequences: one bucket)."""
    base, adapters, expected = family
    llm = LLM(
        model=str(base),
        dtype="float32",
        device="cuda",
        max_num_seqs=8,
        kv_cache_memory=2**26,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=16,
    )
    for name, folder in adapters.items():
        llm.add_lora(name, str(folder))
    names = [None, *adapters]
    outputs = llm.generate(
        [p for _ in names for p in PROMPTS], GREEDY, lora_name=[n for n in names for _ in PROMPTS]
    )
    tokens = [o.outputs[0].token_ids for o in outputs]
    assert tokens == [_expected(expected, llm, n, p) for n in names for p in PROMPTS]
    assert llm.engine.runner.last_graph_batch == 8


def test_a_family_whose_attention_lora_cannot_reach_refuses_enable_lora_in_one_sentence(tmp_path):
    folder = build_tiny_model(tmp_path / "deepseek", "deepseek_v3")
    with pytest.raises(ValueError, match="not served on deepseek_v3 models .* without --enable-lora"):
        LLM(str(folder), dtype="float32", device="cpu", enable_lora=True)
