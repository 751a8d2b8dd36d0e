"""--speculative-config as vLLM spells it: parsed once, each bad field a start-up error naming it."""

from __future__ import annotations

import pytest
from pagoda_runtime.cli import engine_config, parser
from pagoda_runtime.contract.flags import to_args
from pagoda_runtime.contract.speculative import (
    SpeculativeConfig,
    SpeculativeConfigError,
    parse_speculative_config,
)


def serve(*flags):
    return engine_config(parser().parse_args(["serve", *flags]))


def test_vllms_ngram_config_reaches_the_engine_and_round_trips_as_a_flag():
    config = serve(
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}',
    )
    assert config.speculative_config == SpeculativeConfig("ngram", 4, 4, 2)
    assert serve(*to_args(["speculative_config"], config)).speculative_config == config.speculative_config
    assert serve().speculative_config is None


def test_a_draft_model_config_infers_its_method_and_round_trips():
    config = serve("--speculative-config", '{"model": "smollm2-135m", "num_speculative_tokens": 3}')
    draft = config.speculative_config
    assert (draft.method, draft.model, draft.num_speculative_tokens) == ("draft_model", "smollm2-135m", 3)
    assert draft.prompt_lookup_max is None
    assert serve(*to_args(["speculative_config"], config)).speculative_config == draft
    explicit = parse_speculative_config(
        {
            "method": "draft_model",
            "model": "/models/d",
            "num_speculative_tokens": 2,
            "disable_by_batch_size": 16,
        }
    )
    assert (explicit.model, explicit.disable_by_batch_size) == ("/models/d", 16)


def test_an_eagle_config_names_its_head_and_round_trips():
    config = serve(
        "--speculative-config", '{"method": "eagle3", "model": "/heads/e3", "num_speculative_tokens": 4}'
    )
    head = config.speculative_config
    assert (head.method, head.model, head.num_speculative_tokens) == ("eagle3", "/heads/e3", 4)
    assert serve(*to_args(["speculative_config"], config)).speculative_config == head
    assert (
        parse_speculative_config({"method": "eagle", "model": "h", "num_speculative_tokens": 2}).method
        == "eagle"
    )


@pytest.mark.parametrize("method", ["mtp", "deepseek_mtp", "glm4_moe_mtp"])
def test_mtp_and_vllms_earlier_names_for_it_are_one_method(method):
    config = parse_speculative_config({"method": method, "num_speculative_tokens": 2})
    assert config == SpeculativeConfig("mtp", 2)
    assert parse_speculative_config(str(config)) == config


def test_lookup_bounds_default_as_in_vllm():
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3}) == SpeculativeConfig(
        "ngram", 3, 5, 5
    )
    only_max = parse_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    assert (only_max.prompt_lookup_max, only_max.prompt_lookup_min) == (4, 4)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ('{"method": "lookahead", "num_speculative_tokens": 3}', "speculative_config.method"),
        ('{"method": "medusa", "num_speculative_tokens": 3}', "not supported yet"),
        ('{"method": "eagle3", "num_speculative_tokens": 3}', "speculative_config.model must name the EAGLE"),
        ('{"method": "eagle", "model": "h", "num_speculative_tokens": 3, "prompt_lookup_min": 2}', "ngram"),
        ('{"method": "ngram", "model": "draft", "num_speculative_tokens": 3}', "speculative_config.model"),
        ('{"method": "draft_model", "num_speculative_tokens": 3}', "speculative_config.model"),
        ('{"method": "mtp", "model": "m", "num_speculative_tokens": 1}', "not taken by the mtp method"),
        ('{"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 3}', "ngram method only"),
        (
            '{"model": "draft", "num_speculative_tokens": 3, "prompt_lookup_max": 3}',
            "speculative_config.prompt_lookup_max",
        ),
        (
            '{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 0}',
            "speculative_config.disable_by_batch_size",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "speculative_config.num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 17}', "speculative_config.num_speculative_tokens"),
        ('{"method": "ngram"}', "speculative_config.num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": 4, "lookup": 2}', "unknown field(s) lookup"),
        (
            '{"method": "ngram", "num_speculative_tokens": 4, '
            '"prompt_lookup_max": 2, "prompt_lookup_min": 3}',
            "speculative_config.prompt_lookup_max",
        ),
        ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 0}', "prompt_lookup_min"),
        ("[1, 2]", "must be a JSON object"),
        ("{method: ngram}", "not valid JSON"),
    ],
)
def test_bad_configs_are_start_up_errors_naming_the_field(config, named, capsys):
    with pytest.raises(SystemExit):
        serve("--speculative-config", config)
    assert named in capsys.readouterr().err
    with pytest.raises(SpeculativeConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        parse_speculative_config(config)
