"""Settings declared once (contract/flags.py): `serve`, the benchmarks and the step profile read the
same flags, every flag is explained, and an argument list written from settings reads back as them."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from pagoda_runtime.cli import engine_config, main, parser, server_settings
from pagoda_runtime.contract.config import EngineConfig
from pagoda_runtime.contract.flags import add_flags, from_args, to_args
from pagoda_runtime.contract.lora_modules import LoraModule, parse_lora_module
from pagoda_runtime.contract.serve_settings import DistributedSettings, ServerSettings

from benchmarks import step_profile

# serve's options as vLLM users know them; a rename here breaks their command lines.
SERVE_OPTIONS = {
    "--model", "--revision", "--load-format", "--dtype", "--device", "--quantization", "--kv-cache-dtype",
    "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--block-size",
    "--kv-cache-memory", "--gpu-memory-utilization", "--enable-prefix-caching",
    "--no-enable-prefix-caching", "--enforce-eager", "--async-scheduling", "--no-async-scheduling",
    "--disable-async-output-proc", "--speculative-config", "--scheduling-policy", "--seed",
    "--hf-overrides", "--runner", "--pooler-config",
    "--tensor-parallel-size", "-tp",
    "--served-model-name", "--host", "--port", "--api-key", "--max-queue", "--drain-timeout",
    "--canary-interval", "--tool-call-parser", "--chat-template", "--allowed-origins",
    "--allowed-methods", "--allowed-headers", "--allow-credentials", "--metrics-compat",
    "--return-tokens-as-token-ids", "--reasoning-parser", "--generation-config",
    "--enable-auto-tool-choice", "--no-enable-auto-tool-choice", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--trust-remote-code",
    "--termination-log", "--log-format", "--log-level", "--pipeline-parallel-size", "-pp",
    "--distributed-port", "--distributed-timeout", "--enable-lora", "--lora-modules", "--max-loras",
    "--max-lora-rank", "--max-cpu-loras", "--download-dir",
}  # fmt: skip


def _subparser(name: str, *path: str) -> argparse.ArgumentParser:
    current = parser()
    for step in (name, *path):
        (sub,) = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        current = sub.choices[step]
    return current


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in p._actions for o in a.option_strings if o not in ("-h", "--help")}


def test_serve_keeps_its_options_and_explains_each_one():
    options = _options(_subparser("serve"))
    assert set(options) == SERVE_OPTIONS
    unexplained = sorted(o for o, action in options.items() if len((action.help or "").strip()) < 10)
    assert not unexplained, f"serve flags without help: {unexplained}"
    help_text = _subparser("serve").format_help()
    assert "most sequences batched together per step (default: 256)" in " ".join(help_text.split())


def test_vllms_disable_flag_and_the_negatable_one_set_the_same_engine_setting():
    def async_scheduling(*flags):
        return engine_config(parser().parse_args(["serve", *flags])).async_scheduling

    assert async_scheduling() is None  # the device decides
    assert async_scheduling("--disable-async-output-proc") is False
    assert async_scheduling("--no-async-scheduling") is False
    assert async_scheduling("--async-scheduling") is True


def test_the_benchmarks_and_the_step_profile_take_serves_engine_flags():
    serve = _options(_subparser("serve"))
    profile = step_profile.parse_args(["--shape", "tiny-llama", "--out", "x", "--disable-async-output-proc"])
    assert profile.async_scheduling is False and profile.kv_cache_memory == EngineConfig.kv_cache_memory
    for command in ("throughput", "latency"):
        bench = _options(_subparser("bench", command))
        shared = set(bench) & set(serve)
        assert {"--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-memory", "--dtype"} <= shared
        for option in shared:
            assert (bench[option].help, bench[option].choices) == (
                serve[option].help,
                serve[option].choices,
            ) or (option == "--quantization" and bench[option].default == "none"), option
        args = parser().parse_args(["bench", command, "--shape", "tiny-llama"])
        config = from_args(EngineConfig, args, model=args.shape)
        assert config == EngineConfig(model="tiny-llama", quantization="none")


def test_settings_written_as_arguments_read_back_the_same():
    engine = EngineConfig(
        model="/models/m.gguf",
        dtype="float16",
        quantization="int4",
        kv_cache_dtype="fp8",
        max_model_len=4096,
        max_num_seqs=8,
        kv_cache_memory=2e9,
        gpu_memory_utilization=0.8,
        enable_prefix_caching=False,
        enforce_eager=True,
        async_scheduling=False,
        tensor_parallel_size=2,
        enable_lora=True,
        lora_modules=("a=/adapters/a", '{"name": "b", "path": "/adapters/b"}'),
        max_loras=4,
        max_lora_rank=64,
        max_cpu_loras=8,
        trust_remote_code=True,
        hf_overrides={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "max_position_embeddings": 65536},
    )
    server = ServerSettings(
        served_model_names=("main", "alias"),
        model=engine.model,
        port=9000,
        max_num_seqs=8,
        max_queue=3,
        drain_timeout=90.0,
        allowed_origins=("https://a.example", "https://b.example"),
        allow_credentials=True,
        metrics_compat="vllm",
        return_tokens_as_token_ids=True,
        reasoning_parser="deepseek_r1",
        generation_config="vllm",
        enable_auto_tool_choice=False,
        log_format="json",
    )
    distributed = DistributedSettings(distributed_port=29600, distributed_timeout=40.0)
    names = [
        f.name
        for cls in (EngineConfig, ServerSettings, DistributedSettings)
        for f in dataclasses.fields(cls)
        if "flag" in f.metadata
    ]
    args = parser().parse_args(["serve", *to_args(names, engine, server, distributed)])
    assert engine_config(args) == engine
    assert server_settings(args) == server
    assert from_args(DistributedSettings, args) == distributed


def test_unset_settings_write_no_argument_and_unknown_names_are_refused():
    assert to_args(["max_model_len", "enforce_eager", "max_queue"], EngineConfig(), ServerSettings()) == []
    assert to_args(["enable_prefix_caching"], EngineConfig()) == ["--enable-prefix-caching"]
    with pytest.raises(KeyError, match="no flag sets 'canary_timeout'"):
        to_args(["canary_timeout"], ServerSettings())


def test_a_parser_may_take_a_few_flags_with_its_own_defaults():
    p = argparse.ArgumentParser()
    add_flags(p, EngineConfig, ("quantization", "max_num_seqs"), quantization="none")
    assert {a.dest for a in p._actions} == {"help", "quantization", "max_num_seqs"}
    assert from_args(EngineConfig, p.parse_args([])) == EngineConfig(quantization="none")


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("no-equals-sign", "has no '='"),
        ("=/path", "empty name or path"),
        ('{"name": "a"', "not valid JSON"),
        ('{"name": "a", "path": "/p", "rank": 8}', "needs string fields name and path only"),
    ],
)
def test_a_bad_lora_module_is_refused_with_its_form(word, message):
    with pytest.raises(ValueError, match=message):
        parse_lora_module(word)


def test_lora_modules_take_vllm_forms():
    assert parse_lora_module("a=/adapters/a") == LoraModule("a", "/adapters/a")
    word = '{"name": "b", "path": "/adapters/b", "base_model_name": "llama"}'
    assert parse_lora_module(word) == LoraModule("b", "/adapters/b", "llama")


def test_a_vllm_command_line_starts_as_it_is():
    """What vLLM users pass out of habit: auto tool choice (always served here), chunked prefill
    (always on), trust-remote-code (no remote code runs here); a chunking switch turned off is
    refused in one sentence rather than ignored."""
    vllm_line = ["serve", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    args = parser().parse_args([*vllm_line, "--enable-chunked-prefill", "--trust-remote-code"])
    assert server_settings(args).enable_auto_tool_choice and engine_config(args).enable_chunked_prefill
    with pytest.raises(ValueError, match="--no-enable-chunked-prefill is not supported"):
        engine_config(parser().parse_args(["serve", "--no-enable-chunked-prefill"]))


def test_serve_refuses_flags_that_do_not_go_together_in_one_sentence(capsys):
    assert main(["serve", "--tool-call-parser", "openai"]) == 1
    assert "--reasoning-parser openai_gptoss" in capsys.readouterr().err
    assert main(["serve", "--no-enable-chunked-prefill"]) == 1
    assert "--no-enable-chunked-prefill is not supported" in capsys.readouterr().err
