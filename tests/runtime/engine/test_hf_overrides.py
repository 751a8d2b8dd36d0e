"""vLLM's --hf-overrides (LLM(hf_overrides=...)): keys that replace config.json's before the model
is built. The use users have for it: YaRN, to serve Qwen past its trained context. A tiny Qwen 3
given YaRN this way decodes a prompt longer than its original context as transformers does with
the same rope scaling, and serves that context times the factor by default."""

import pytest
import torch
from pagoda_runtime import LLM, SamplingParams
from pagoda_runtime.contract.config import parse_hf_overrides
from transformers import AutoConfig, AutoModelForCausalLM

from tests.runtime.engine.hf_reference import hf_greedy
from tests.runtime.tiny_models import build_tiny_model

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
PROMPT = [(7 * i) % 200 + 5 for i in range(100)]  # longer than the original 64 positions
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("yarn") / "qwen3", "qwen3")


def hf_with(folder, rope_scaling=None):
    config = AutoConfig.from_pretrained(folder)
    if rope_scaling is not None:
        config.rope_parameters = {**rope_scaling, "rope_theta": config.rope_parameters["rope_theta"]}
    return AutoModelForCausalLM.from_pretrained(
        folder, config=config, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def make(folder, **kwargs):
    return LLM(str(folder), dtype="float32", device="cpu", block_size=4, max_num_batched_tokens=32, **kwargs)


def test_yarn_given_as_an_override_decodes_as_transformers_does(folder):
    stretched = hf_greedy(hf_with(folder, YARN), PROMPT, 8)
    assert stretched != hf_greedy(hf_with(folder), PROMPT, 8)
    llm = make(folder, hf_overrides={"rope_scaling": YARN})
    assert llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == stretched
    assert llm.engine.max_model_len == 64 * 4  # the original context times the factor, as vLLM


def test_overrides_that_cannot_apply_are_refused_in_one_sentence():
    for value, message in [("[1, 2]", "must be a non-empty JSON object"), ("{oops", "not valid JSON")]:
        with pytest.raises(ValueError, match=message):
            parse_hf_overrides(value)
    overrides = {"max_position_embeddings": 64}
    with pytest.raises(ValueError, match="random weights have none"):
        LLM("tiny-llama", load_format="dummy", device="cpu", hf_overrides=overrides)
    with pytest.raises(ValueError, match="is not one; drop the flag"):
        LLM("smollm2-135m", device="cpu", hf_overrides=overrides)  # the bundled model is a GGUF file
