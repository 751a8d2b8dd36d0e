"""`pagoda-runtime serve` flags become the engine's and the server's settings as a vLLM user expects."""

from __future__ import annotations

import pytest
from pagoda_runtime.cli import API_KEY_ENV, engine_config, layout, parser, server_settings


def test_serve_flags_reach_the_engine_config():
    args = parser().parse_args(
        [
            "serve",
            "--model",
            "/m/llama.gguf",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "512",
            "--block-size",
            "32",
            "--kv-cache-memory",
            "1e9",
            "--no-enable-prefix-caching",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--quantization",
            "gguf",
            "--kv-cache-dtype",
            "fp8",
            "--disable-async-output-proc",
        ]
    )
    config = engine_config(args)
    assert (config.model, config.max_model_len, config.max_num_seqs, config.max_num_batched_tokens) == (
        "/m/llama.gguf",
        2048,
        8,
        512,
    )
    assert (config.block_size, config.kv_cache_memory, config.enable_prefix_caching) == (32, 1e9, False)
    assert (config.device, config.dtype) == ("cpu", "float32")
    assert (config.quantization, config.kv_cache_dtype) == ("gguf", "fp8")
    assert config.async_scheduling is False
    # Without the flag the device decides (on where it runs apart from the host).
    assert engine_config(parser().parse_args(["serve"])).async_scheduling is None
    assert engine_config(parser().parse_args(["serve", "--async-scheduling"])).async_scheduling is True
    assert engine_config(parser().parse_args(["serve", "--no-async-scheduling"])).async_scheduling is False


def test_quantization_defaults_to_the_checkpoints_own_and_unknown_choices_are_refused(capsys):
    config = engine_config(parser().parse_args(["serve"]))
    assert (config.quantization, config.kv_cache_dtype) == ("auto", "auto")
    for flags in (["--quantization", "int3"], ["--kv-cache-dtype", "fp16"]):
        with pytest.raises(SystemExit):
            parser().parse_args(["serve", *flags])
        assert "invalid choice" in capsys.readouterr().err


def test_load_format_defaults_to_the_checkpoint_and_takes_dummy(capsys):
    assert engine_config(parser().parse_args(["serve"])).load_format == "auto"
    config = engine_config(parser().parse_args(["serve", "--model", "llama-3-8b", "--load-format", "dummy"]))
    assert (config.model, config.load_format) == ("llama-3-8b", "dummy")
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--load-format", "safetensors"])
    assert "invalid choice" in capsys.readouterr().err


def test_server_settings_default_the_name_and_read_the_key_from_the_environment(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    settings = server_settings(parser().parse_args(["serve", "--max-queue", "4", "--drain-timeout", "90"]))
    assert settings.served_model_name == "smollm2-135m"
    assert settings.api_key == "from-env" and settings.max_queue == 4 and settings.drain_timeout == 90
    named = server_settings(parser().parse_args(["serve", "--served-model-name", "m", "--api-key", "flag"]))
    assert named.served_model_name == "m" and named.api_key == "flag"
    # A key Secret made from a file ends in a newline that clients never send.
    monkeypatch.setenv(API_KEY_ENV, "from-file\n")
    assert server_settings(parser().parse_args(["serve"])).api_key == "from-file"


def test_vllm_flags_reach_the_settings(tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    args = parser().parse_args(
        [
            "serve",
            "--served-model-name",
            "main",
            "alias",
            "--chat-template",
            str(template),
            "--allowed-origins",
            '["https://a.example", "https://b.example"]',
            "--allowed-methods",
            "GET,POST",
            "--allow-credentials",
            "--metrics-compat",
            "vllm",
            "--tool-call-parser",
            "llama3_json",
            "--gpu-memory-utilization",
            "0.8",
            "--max-num-seqs",
            "4",
        ]
    )
    settings = server_settings(args)
    assert settings.model_names == ("main", "alias")
    assert settings.chat_template == "{{ messages[0]['content'] }}"
    assert settings.allowed_origins == ("https://a.example", "https://b.example")
    assert settings.allowed_methods == ("GET", "POST") and settings.allow_credentials
    assert settings.metrics_compat == "vllm" and settings.tool_call_parser == "llama3_json"
    assert settings.max_num_seqs == 4 and settings.max_queue is None
    assert engine_config(args).gpu_memory_utilization == 0.8
    inline = server_settings(parser().parse_args(["serve", "--chat-template", "{{ 'x' }}"]))
    assert inline.chat_template == "{{ 'x' }}" and inline.allowed_origins == ()


def test_a_malformed_origin_list_is_refused(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--allowed-origins", '["a", 1]'])
    assert "JSON list of strings" in capsys.readouterr().err


def test_parallel_flags_reach_the_layout_and_pipeline_parallelism_is_refused(capsys):
    args = parser().parse_args(
        ["serve", "--tensor-parallel-size", "2", "--distributed-port", "29600", "--distributed-timeout", "40"]
    )
    world = layout(args, env={})
    assert (world.tensor_parallel_size, world.port, world.timeout_s) == (2, 29600, 40.0)
    assert layout(parser().parse_args(["serve", "-pp", "1"]), env={}).tensor_parallel_size == 1
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--pipeline-parallel-size", "2"])
    assert "tensor parallelism only" in capsys.readouterr().err
