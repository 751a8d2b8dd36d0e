"""Which bytes the operator counts for a variant: the quantization auto resolves to, and the KV dtype."""

from __future__ import annotations

from operator_specs import spec
from pagoda_operator.plan import plan_variant

LONG_CONTEXT = {"source": "pvc://models/llama", "family": "llama-3.1-8b", "maxModelLen": 131072}


def test_fp8_kv_cache_lets_a_long_context_fit_where_the_models_dtype_does_not():
    # bf16 weights are 15 GiB; one 128k-token sequence takes 16 GiB of bf16 KV, 8 GiB in fp8.
    s = spec(
        model=LONG_CONTEXT,
        variants=[{"name": "bf16"}, {"name": "fp8kv", "kvCacheDtype": "fp8"}],
        resources={"gpuMemory": "32Gi"},
    )
    bf16, fp8 = (plan_variant(s, v).fit for v in s.variants)
    assert not bf16.fits and fp8.fits
    assert fp8.kv_bytes * 2 == bf16.kv_bytes and fp8.weight_bytes == bf16.weight_bytes


def test_auto_is_sized_as_the_runtime_will_serve_the_checkpoint():
    bundled = {"source": "bundled://smollm2-135m", "family": "smollm2-135m"}
    on_gpu = spec(model=bundled, resources={"gpuMemory": "16Gi"})
    on_cpu = spec(model=bundled, resources={"gpus": 0, "memory": "4Gi"})
    exact_cpu = spec(model=bundled, resources={"gpus": 0, "memory": "4Gi"}, runtime={"dtype": "float32"})
    assert plan_variant(on_gpu, on_gpu.variants[0]).quantization == "gguf"
    assert plan_variant(on_cpu, on_cpu.variants[0]).quantization == "gguf"
    assert plan_variant(exact_cpu, exact_cpu.variants[0]).quantization == "none"
    assert (
        plan_variant(on_cpu, on_cpu.variants[0]).fit.weight_bytes
        < plan_variant(exact_cpu, exact_cpu.variants[0]).fit.weight_bytes
    )

    folder = spec(model={"source": "pvc://models/llama", "family": "llama-3-8b"})
    assert plan_variant(folder, folder.variants[0]).quantization == "none"
    named = spec(
        model={"source": "pvc://models/llama-awq", "family": "llama-3-8b"},
        variants=[{"name": "a", "quantization": "awq"}],
    )
    assert plan_variant(named, named.variants[0]).quantization == "awq"


def test_a_gguf_file_is_sized_by_the_block_type_its_name_states():
    # Sized as 4-bit blocks, a Q8_0 file of Llama 3 8B would be admitted to a GPU it cannot fit.
    def sized(source):
        s = spec(model={"source": source, "family": "llama-3-8b"}, resources={"gpuMemory": "10Gi"})
        return plan_variant(s, s.variants[0]).fit

    q4, q8 = sized("file:///m/llama.Q4_0.gguf"), sized("pvc://models/Llama-3-8B-Q8_0.gguf")
    assert q4.fits and not q8.fits
    # Q4_K_M is served packed (Q4_K, with Q6_K attn_v/ffn_down in some layers); Q5_K has no packed
    # layout, so --quantization auto dequantizes a Q5_K_M file and it is sized as bf16.
    q4_k_m, q5_k_m = sized("pvc://models/Llama-3-8B-Q4_K_M.gguf"), sized("file:///m/llama.Q5_K_M.gguf")
    assert q4_k_m.fits and q4.weight_bytes < q4_k_m.weight_bytes < q8.weight_bytes
    assert not q5_k_m.fits and q5_k_m.weight_bytes > q8.weight_bytes
    # Unnamed: sized as dequantized, the most any GGUF file can take.
    assert sized("file:///m/llama.gguf").weight_bytes == q5_k_m.weight_bytes


def test_a_hybrids_recurrent_states_are_counted_for_every_running_sequence():
    # Qwen3-Next-80B-A3B in int4 on two GPUs: 36 DeltaNet layers hold 18.8 MiB of states a sequence
    # on each GPU (half the value heads), for maxNumSeqs sequences and two spares, from the start:
    # 256 sequences need 27.8 GiB a GPU, 1024 need 42.0 GiB.
    model = {"source": "pvc://models/qwen3-next", "family": "qwen3-next-80b-a3b", "maxModelLen": 32768}
    resources = {"gpus": 2, "gpuMemory": "40Gi"}
    few = spec(model=model, resources=resources, variants=[{"name": "q", "quantization": "int4"}])
    many = spec(
        model=model,
        resources=resources,
        variants=[{"name": "q", "quantization": "int4"}],
        runtime={"maxNumSeqs": 1024},
    )
    small, large = plan_variant(few, few.variants[0]).fit, plan_variant(many, many.variants[0]).fit
    per_sequence = 36 * ((2 * 16 * 128 + 32 * 128) // 2 * 3 + 16 * 128 * 128) * 2
    assert large.state_bytes == (1024 + 2) * per_sequence
    assert small.state_bytes == (few.runtime.max_num_seqs + 2) * per_sequence
    assert small.fits and not large.fits
    assert "recurrent states of the running sequences" in large.describe()
