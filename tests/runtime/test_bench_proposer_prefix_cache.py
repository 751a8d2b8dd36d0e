"""The draft prefix-cache benchmark on a short system prompt: with the draft's cache on, each
request finds the shared prompt in both caches; off, only in the target's."""

import json

import pytest

from benchmarks import proposer_prefix_cache

pytestmark = pytest.mark.slow


def test_the_draft_finds_the_system_prompt_only_with_its_cache_on(tmp_path):
    out = tmp_path / "result.json"
    argv = ["--system-tokens", "64", "--requests", "1", "--max-tokens", "6", "--result-json", str(out)]
    assert proposer_prefix_cache.main(argv) == 0
    on, off = json.loads(out.read_text())["settings"]
    assert on["target_cached_tokens_per_request"] == off["target_cached_tokens_per_request"] == 64
    assert (on["draft_cached_tokens_per_request"], off["draft_cached_tokens_per_request"]) == (64, 0)
