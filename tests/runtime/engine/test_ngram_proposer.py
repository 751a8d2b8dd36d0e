"""N-gram prompt lookup: the longest recent n-gram that occurred before drafts what followed it."""

from pagoda_runtime.contract.speculative import SpeculativeConfig
from pagoda_runtime.engine.ngram_proposer import NgramProposer, ngram_lookup
from pagoda_runtime.engine.sampling_params import SamplingParams
from pagoda_runtime.engine.sequence import Sequence, SequenceGroup


def test_the_tokens_after_an_earlier_occurrence_of_the_suffix_are_proposed():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 1, 2, 3, 7, 8, 9, 4, 1, 2]
    assert ngram_lookup(tokens, 3, 3, 1) == [3, 7, 8]
    assert ngram_lookup(tokens, 10, 3, 1) == [3, 7, 8, 9, 4, 1, 2]  # as many as there are


def test_the_longest_matching_ngram_wins_over_a_later_shorter_one():
    # "1 2" occurred at 0 (then 3) and "2" alone again at 5 (then 9): the bigram decides.
    tokens = [1, 2, 3, 4, 0, 2, 9, 1, 2]
    assert ngram_lookup(tokens, 1, 2, 1) == [3]
    assert ngram_lookup(tokens, 1, 1, 1) == [9]  # unigrams only: the latest "2"


def test_no_occurrence_or_too_short_a_suffix_proposes_nothing():
    assert ngram_lookup([1, 2, 3, 4], 3, 3, 1) == []
    assert ngram_lookup([1, 2, 3, 1, 2], 3, 3, 3) == []  # "3 1 2" never occurred before
    assert ngram_lookup([1], 3, 3, 1) == []


def test_the_latest_occurrence_with_a_full_draft_after_it_is_used():
    tokens = [1, 2, 3, 1, 2, 4, 5, 6, 1, 2]
    assert ngram_lookup(tokens, 2, 2, 2) == [4, 5]
    assert ngram_lookup(tokens, 6, 2, 2) == [3, 1, 2, 4, 5, 6]  # only the first has six after it


def test_the_proposer_stops_at_max_tokens_and_the_budget():
    params = SamplingParams(max_tokens=4)
    seq = Sequence(SequenceGroup("r", [1, 2, 3, 4, 5, 6, 1, 2], params, 0.0), 0)
    proposer = NgramProposer(SpeculativeConfig("ngram", 4, 2, 1))
    assert proposer.propose([seq], [10]) == [([3, 4, 5], None)]  # 3 drafted + the target's own = max_tokens
    assert proposer.propose([seq], [2]) == [([3, 4], None)]
