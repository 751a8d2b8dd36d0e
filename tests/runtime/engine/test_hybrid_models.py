"""Hybrid models, Mamba-2, gated DeltaNet or short-convolution layers beside attention (Granite
4.0-H's, Nemotron-H's, Qwen3.5's, Qwen3-Next's and LFM2's layouts, tiny_models.HYBRID_VARIANTS): the
engine's greedy tokens and logits equal transformers' in float32, whatever the batching does to a
sequence's state (prompts chunked over steps, sequences joining and leaving a batch, preemption, n
samples, scoring between steps), and what the runtime cannot do for them is refused in one
sentence."""

import json
import shutil

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.sizing import (
    STATE_SLOTS_BEYOND_SEQS,
    check_tensor_parallel,
    fits,
    kv_bytes_for_context,
    kv_bytes_per_token,
    kv_pools,
    state_bytes,
)
from pagoda_runtime.engine.scoring import score
from pagoda_runtime.executor.models import gated_deltanet, mamba2
from pagoda_runtime.loading.model_source import ModelLoadError, load_model_source
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.tiny_lora import build_tiny_adapter, merged_reference
from tests.runtime.tiny_models import HYBRID_VARIANTS, build_tiny_model

NEW_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
PROMPTS = [
    "Hello, world! How are",
    "def add(a, b):",
    "1",  # a one-token prompt: its first step is a decode-shaped step from a fresh state
    " ".join(["The quick brown fox jumps over the lazy dog."] * 6),  # many chunks of 7 tokens
]


@pytest.fixture(scope="module", params=sorted(HYBRID_VARIANTS))
def folder(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("hybrid") / request.param, request.param)


def grouped_gated_norm(norm, groups):
    """transformers' gated RMSNorm normalized per group of heads, as mamba_ssm's kernel (which
    trained Granite 4.0-H) and vLLM compute it; transformers' own reference normalizes over all
    heads at once, which differs only where a model has several groups (the tiny one has two)."""

    def forward(hidden_states, gate=None):
        x = hidden_states.float() * torch.nn.functional.silu(gate.float())
        x = x.view(*x.shape[:-1], groups, -1)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return norm.weight * x.flatten(-2).to(hidden_states.dtype)

    return forward


def reference(model):
    """transformers' model, its Granite gated norms per group (Nemotron-H's already are)."""
    for layer in model.model.layers:
        if getattr(layer, "mamba", None) is not None:
            layer.mamba.norm.forward = grouped_gated_norm(layer.mamba.norm, model.config.mamba_n_groups)
    return model.eval()


@pytest.fixture(scope="module")
def hf(folder):
    return reference(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))


def engine(folder, **kwargs):
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=7, **kwargs)


def assert_matches_hf(outputs, hf):
    for output in outputs:
        for sample in output.outputs:
            assert sample.token_ids == hf_greedy(hf, output.prompt_token_ids, NEW_TOKENS), output.prompt


def assert_everything_free(llm):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert bm.num_free_slots == llm.engine.runner.state_slots


def test_greedy_tokens_match_transformers_as_prompts_are_chunked_and_batched(folder, hf):
    llm = engine(folder)
    assert_matches_hf(llm.generate(PROMPTS, GREEDY), hf)
    # Again in another order: slots handed back are reused, each from a fresh state.
    assert_matches_hf(llm.generate(PROMPTS[::-1], GREEDY), hf)
    assert_everything_free(llm)
    # A state holds a sequence's whole past: no prefix is shared, so prefix caching is off.
    assert not llm.engine.block_manager.enable_prefix_caching
    assert llm.engine.stats().prefix_cache_hits == 0


def test_greedy_tokens_match_transformers_under_preemption(folder, hf):
    arch = load_model_source(folder, torch.float32).config.architecture
    states = (4 + STATE_SLOTS_BEYOND_SEQS) * state_bytes(arch, "float32")
    layer_block = 4 * kv_bytes_per_token(arch, "float32")
    # Blocks for one long prompt, not for two at once.
    llm = engine(folder, max_model_len=160, max_num_seqs=4, kv_cache_memory=states + 45 * layer_block)
    assert llm.engine.block_manager.num_blocks == 45
    prompts = [PROMPTS[3] + " She", PROMPTS[3] + " He", PROMPTS[0]]
    assert_matches_hf(llm.generate(prompts, GREEDY), hf)
    assert llm.engine.stats().num_preemptions > 0
    assert_everything_free(llm)


def test_every_sample_of_a_request_computes_its_own_state(folder, hf):
    llm = engine(folder)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, n=3)
    outputs = llm.generate(PROMPTS[:2], params)
    assert all(len(output.outputs) == 3 for output in outputs)
    assert_matches_hf(outputs, hf)
    assert_everything_free(llm)


def test_logits_match_transformers_and_scoring_borrows_a_slot(folder, hf):
    llm = engine(folder, max_num_seqs=1)
    token_ids = llm.get_tokenizer().encode(PROMPTS[3])
    with torch.inference_mode():
        expected = hf(torch.tensor([token_ids])).logits[0].float()
    # float32 rounding: the chunked delta rule sums in another order than transformers' (3.6e-4 at
    # most on the tiny Qwen3.5), while the rule itself equals the recurrence in float64 (below).
    torch.testing.assert_close(score(llm.engine, token_ids), expected, rtol=1e-3, atol=1e-3)
    assert_everything_free(llm)


def test_the_chunked_scan_equals_the_recurrence_across_chunks_and_from_a_state(monkeypatch):
    monkeypatch.setattr(mamba2, "SCAN_CHUNK", 5)
    torch.manual_seed(0)
    tokens, heads, head_dim, size = 13, 3, 4, 6
    x = torch.randn(tokens, heads, head_dim)
    dt = torch.rand(tokens, heads)
    A = -torch.rand(heads) * 2
    B, C = torch.randn(tokens, heads, size), torch.randn(tokens, heads, size)
    h = torch.randn(heads, head_dim, size)
    y, last = mamba2.chunked_scan(x, dt, A, B, C, h)
    expected = []
    for t in range(tokens):
        h = h * torch.exp(dt[t] * A)[:, None, None] + (dt[t][:, None] * x[t])[..., None] * B[t][:, None, :]
        expected.append(h @ C[t][..., None])
    torch.testing.assert_close(y, torch.stack(expected).squeeze(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(last, h, rtol=1e-4, atol=1e-5)


def test_the_chunked_delta_rule_equals_the_recurrence_across_chunks_and_from_a_state(monkeypatch):
    monkeypatch.setattr(gated_deltanet, "RULE_CHUNK", 7)
    torch.manual_seed(0)
    tokens, heads, k_dim, v_dim = 30, 3, 8, 6
    f64 = dict(dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, **f64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(tokens, heads, k_dim, **f64), dim=-1)
    v = torch.randn(tokens, heads, v_dim, **f64)
    g, beta = -torch.rand(tokens, heads, **f64), torch.rand(tokens, heads, **f64)
    h = torch.randn(heads, k_dim, v_dim, **f64)
    out, last = gated_deltanet.chunked_delta_rule(q, k, v, g, beta, h)
    expected = []
    for t in range(tokens):
        h = h * torch.exp(g[t])[:, None, None]
        remembered = (h * k[t][..., None]).sum(-2)
        h = h + k[t][..., None] * ((v[t] - remembered) * beta[t][..., None])[..., None, :]
        expected.append((h * q[t][..., None]).sum(-2))
    torch.testing.assert_close(out, torch.stack(expected), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, h, rtol=1e-12, atol=1e-12)


def test_sizing_counts_the_states_and_the_attention_layers_kv(folder):
    arch = load_model_source(folder, torch.float32).config.architecture
    assert (arch.num_state_layers, arch.num_attention_layers) == (2, 1)
    layer = next(i for i in range(arch.num_hidden_layers) if arch.is_state_layer(i))
    if arch.layer_types[layer] == "mamba":
        conv = arch.mamba_conv_dim * (arch.mamba_conv_kernel - 1)
        heads = arch.mamba_num_heads * arch.mamba_head_dim * arch.mamba_state_size
    elif arch.layer_types[layer] == "conv":  # LFM2's short convolution: its window alone
        conv, heads = arch.hidden_size * (arch.short_conv_kernel - 1), 0
    else:  # a gated DeltaNet layer: q, k and v convolved, a key x value state per value head
        conv = (2 * arch.linear_key_dim + arch.linear_value_dim) * (arch.linear_conv_kernel - 1)
        heads = arch.linear_num_value_heads * arch.linear_key_head_dim * arch.linear_value_head_dim
    assert arch.state_numel(layer) == conv + heads
    state = state_bytes(arch, "float32")
    assert state == 2 * (conv + heads) * 4
    per_token = kv_bytes_per_token(arch, "float32")
    assert per_token == 2 * arch.num_key_value_heads * arch.head_dim * 4  # one attention layer's
    assert kv_bytes_for_context(arch, 100, "float32") == 100 * per_token
    # The fit gate counts the states of every running sequence (and the spares) beside one
    # sequence's KV, as the runtime holds them from the start.
    fit = fits(arch, "none", 100, 2**40, kv_dtype="float32", max_num_seqs=8)
    assert fit.state_bytes == (8 + STATE_SLOTS_BEYOND_SEQS) * state and fit.kv_bytes == 100 * per_token
    assert "recurrent states of the running sequences" in fit.describe()
    budget = 10 * state + 50 * 4 * per_token
    pools = kv_pools(arch, budget, 4, 512, 8, 64, "float32")
    # Eight sequences and the spare slots take their states first; the 50 blocks are what is left.
    assert STATE_SLOTS_BEYOND_SEQS == 2 and pools.full_blocks == 50


def test_what_a_hybrid_model_is_not_served_with_is_refused(folder):
    with pytest.raises(ValueError, match="speculative decoding is not served for hybrid models"):
        engine(folder, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    arch = load_model_source(folder, torch.float32).config.architecture
    if "conv" in arch.layer_types:
        with pytest.raises(ValueError, match="use a tensor-parallel size of 1"):
            check_tensor_parallel(arch, 2)
        return
    # Two ranks split the recurrent heads and their states (test_tensor_parallel.py runs them); three
    # split no head evenly.
    assert state_bytes(check_tensor_parallel(arch, 2)) * 2 == state_bytes(arch)
    with pytest.raises(ValueError, match="do not split evenly over 3 tensor-parallel ranks"):
        check_tensor_parallel(arch, 3)


def test_a_config_without_attention_layers_is_refused(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "all-mamba")
    config = json.loads((copy / "config.json").read_text())
    key = "layers_block_type" if config["model_type"] == "nemotron_h" else "layer_types"
    recurrent = {"qwen3_5_text": "linear_attention", "qwen3_next": "linear_attention", "lfm2": "conv"}
    recurrent = recurrent.get(config["model_type"], "mamba")
    config[key] = [recurrent] * len(config[key])
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="attention layer"):
        load_model_source(copy, torch.float32)


def test_sizing_counts_every_parameter_the_checkpoint_holds(folder, hf):
    arch = load_model_source(folder, torch.float32).config.architecture
    assert arch.num_parameters() == sum(p.numel() for p in hf.parameters())


def test_a_multi_token_prediction_layer_in_the_checkpoint_is_left_unread(folder, hf, tmp_path):
    if json.loads((folder / "config.json").read_text())["model_type"] not in ("qwen3_5_text", "qwen3_next"):
        pytest.skip("Qwen3.5's and Qwen3-Next's checkpoints carry an MTP layer")
    copy = shutil.copytree(folder, tmp_path / "with-mtp")
    tensors = load_file(copy / "model.safetensors")
    tensors["mtp.fc.weight"] = torch.zeros(64, 128)
    tensors["mtp.layers.0.input_layernorm.weight"] = torch.zeros(64)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert_matches_hf(engine(copy).generate(PROMPTS[:1], GREEDY), hf)


def test_lora_adapters_reach_the_attention_layers_and_the_dense_mlps(folder, tmp_path):
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    arch = load_model_source(folder, torch.float32).config.architecture
    attending = tuple(i for i in range(arch.num_hidden_layers) if arch.is_attention_layer(i))
    # A gated attention's q_proj gives its gate too: Pagoda adapts k, v and o there.
    targets = ("k_proj", "v_proj", "o_proj") + (() if arch.attention_output_gate else ("q_proj",))
    if not arch.num_experts and arch.gated_mlp:
        targets += ("gate_proj", "up_proj", "down_proj")
    # The modules as each model's own transformers class names them, which its adapters do.
    paths = {
        "nemotron_h": {m: f"mixer.{m}" for m in targets},
        "lfm2": {
            "o_proj": "self_attn.out_proj",
            "gate_proj": "feed_forward.w1",
            "up_proj": "feed_forward.w3",
            "down_proj": "feed_forward.w2",
        },
    }.get(model_type)
    width = arch.intermediate_size
    adapter = build_tiny_adapter(
        tmp_path / "a",
        folder,
        4,
        1,
        targets,
        attention_layers=attending,
        paths=paths,
        intermediate_size=width,
    )
    llm = engine(folder, enable_lora=True, max_lora_rank=8)
    llm.add_lora("a", str(adapter))
    merged = reference(merged_reference(folder, adapter))
    outputs = llm.generate(PROMPTS, GREEDY, lora_name="a")
    for output in outputs:
        assert output.outputs[0].token_ids == hf_greedy(merged, output.prompt_token_ids, NEW_TOKENS)
    base = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in base] != [o.outputs[0].token_ids for o in outputs]
    state_layer = next(i for i in range(arch.num_hidden_layers) if arch.is_state_layer(i))
    stray = build_tiny_adapter(
        tmp_path / "b", folder, 4, 2, ("k_proj",), attention_layers=(state_layer,), paths=paths
    )
    with pytest.raises(ValueError, match=f"targets layer {state_layer}'s k_proj, but that layer"):
        llm.add_lora("b", str(stray))
    if arch.attention_output_gate:
        gated = build_tiny_adapter(tmp_path / "c", folder, 4, 3, ("q_proj",), attention_layers=attending)
        with pytest.raises(ValueError, match="also gives the gate"):
            llm.add_lora("c", str(gated))
