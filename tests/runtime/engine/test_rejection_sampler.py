"""The rejection sampler keeps the target's distribution whatever the draft: a chi-square test on a
tiny vocabulary, strong enough that a sampler without the residual step fails it; under a grammar
the constrained target's, when the draft's q is masked by the grammar too."""

import torch
from pagoda_runtime.executor.rejection_sampler import emitted_counts, rejection_sample, target_probs
from pagoda_runtime.executor.sampler import truncation_mask

VOCAB = 5
SAMPLES = 20_000
# Chi-square critical values at significance 0.001 (the test fails a correct sampler once in a
# thousand seeds; the seed is fixed, so it is deterministic): 4 and 24 degrees of freedom.
CRITICAL_FIRST = 18.467
CRITICAL_JOINT = 51.179
# The same significance by degrees of freedom, for the grammar's allowed tokens and pairs.
CRITICAL_BY_DF = {
    1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
    9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123, 15: 37.697, 16: 39.252,
    17: 40.790, 18: 42.312, 19: 43.820, 20: 45.315, 21: 46.797, 22: 48.268, 23: 49.728, 24: 51.179,
}  # fmt: skip


def without_residual(target, draft_tokens, widths, uniform, noise):
    """What "wrong" means: the acceptance test min(1, p/q) right, but a rejected position drawn
    from p itself instead of the residual max(0, p - q), so the draft token is over-sampled."""
    drafted = draft_tokens >= 0
    p_x = target.gather(1, draft_tokens.clamp(min=0)[:, None])[:, 0]
    accepted = drafted & (uniform < p_x)
    return torch.where(accepted, draft_tokens, (target / noise).argmax(dim=-1)), emitted_counts(
        accepted, widths
    )


class TinyTarget:
    """A 'model' over VOCAB tokens: the first token's distribution, and the next one's given the
    token before it (the third position, the bonus one, follows the second the same way)."""

    def __init__(self, generator):
        self.first = torch.softmax(torch.randn(VOCAB, generator=generator), dim=0)
        self.next = torch.softmax(torch.randn(VOCAB, VOCAB, generator=generator), dim=1)

    def joint(self):
        return self.first[:, None] * self.next


def generate_two(sample, target, generator):
    """Two tokens per sample, each step verifying a two-token draft that, like an n-gram lookup's,
    is a function of the context (token t is followed by t + 1 here, whatever the target thinks);
    samples whose first step emitted one token run a second verify step from it."""
    n = SAMPLES
    drafts = torch.tensor([[1, 2]]).expand(n, 2)
    rows = torch.stack(
        [target.first.expand(n, VOCAB), target.next[drafts[:, 0]], target.next[drafts[:, 1]]], 1
    )
    tokens, emitted = verify(sample, rows, drafts, generator)
    first, second = tokens[:, 0], tokens[:, 1].clone()
    again = emitted == 1
    more = ((first[again] + 1) % VOCAB)[:, None]
    rows = torch.stack([target.next[first[again]], target.next[more[:, 0]]], 1)
    second[again] = verify(sample, rows, more, generator)[0][:, 0]
    return first, second


def verify(sample, rows, drafts, generator):
    """rows [n, k + 1, vocab]: each sequence's distributions; drafts [n, k]."""
    n, width, vocab = rows.shape
    draft_tokens = torch.cat([drafts, torch.full((n, 1), -1)], 1).reshape(-1)
    uniform = torch.rand(n * width, generator=generator)
    noise = torch.empty(n * width, vocab).exponential_(generator=generator)
    tokens, emitted = sample(rows.reshape(-1, vocab), draft_tokens, [width] * n, uniform, noise)
    return tokens.view(n, width), emitted


def chi_square(tokens, probs):
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.reshape(-1).double() * tokens.numel()
    return float(((observed - expected) ** 2 / expected).sum())


def test_speculation_keeps_the_first_and_joint_two_token_distributions():
    generator = torch.Generator().manual_seed(1)
    target = TinyTarget(generator)
    first, second = generate_two(rejection_sample, target, generator)
    assert chi_square(first, target.first) < CRITICAL_FIRST
    assert chi_square(first * VOCAB + second, target.joint()) < CRITICAL_JOINT


def test_without_the_residual_step_the_test_fails():
    generator = torch.Generator().manual_seed(1)
    target = TinyTarget(generator)
    first, second = generate_two(without_residual, target, generator)
    assert chi_square(first, target.first) > CRITICAL_FIRST
    assert chi_square(first * VOCAB + second, target.joint()) > CRITICAL_JOINT


def test_greedy_accepts_exactly_the_argmax_tokens():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    target = target_probs(logits, torch.zeros(0, dtype=torch.int64), torch.zeros(0), None)
    # One sequence drafting [1, 2] (argmax 1 then 0: the second is rejected), one drafting nothing.
    draft_tokens = torch.tensor([1, 2, -1, -1])
    tokens, emitted = rejection_sample(target, draft_tokens, [3, 1], torch.rand(4), torch.ones(4, 3))
    assert emitted.tolist() == [2, 1]
    assert tokens[:2].tolist() == [1, 0] and tokens[3] == 0


def test_the_target_distribution_follows_temperature_and_truncation():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]])
    random = torch.tensor([1])
    temperature = torch.tensor([0.5])
    scaled = logits[random] / temperature[:, None]
    kept = truncation_mask(scaled, torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    probs = target_probs(logits, random, temperature, kept)
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # greedy: the argmax
    top_two = torch.softmax(torch.tensor([6.0, 4.0]), dim=0)
    assert torch.allclose(probs[1], torch.tensor([0.0, top_two[0], 0.0, top_two[1]]))


class TinyDraft:
    """A draft model over the same vocabulary whose distributions differ from the target's: it
    draws its draft tokens from q, and the verifier is told q."""

    def __init__(self, generator):
        self.first = torch.softmax(2 * torch.randn(VOCAB, generator=generator), dim=0)
        self.next = torch.softmax(2 * torch.randn(VOCAB, VOCAB, generator=generator), dim=1)


def generate_two_from_a_draft(sample, target, draft, generator):
    """As generate_two, but each step's two draft tokens are drawn from the draft's q (the second
    given the first), and the verifier gets q; also the mean tokens the first step emitted."""
    n = SAMPLES
    x1 = torch.multinomial(draft.first.expand(n, VOCAB), 1, generator=generator)[:, 0]
    x2 = torch.multinomial(draft.next[x1], 1, generator=generator)[:, 0]
    rows = torch.stack([target.first.expand(n, VOCAB), target.next[x1], target.next[x2]], 1)
    q = torch.stack([draft.first.expand(n, VOCAB), draft.next[x1], torch.zeros(n, VOCAB)], 1)
    tokens, emitted = verify_with_q(sample, rows, torch.stack([x1, x2], 1), q, generator)
    first, second = tokens[:, 0], tokens[:, 1].clone()
    again = emitted == 1
    more = torch.multinomial(draft.next[first[again]], 1, generator=generator)
    rows = torch.stack([target.next[first[again]], target.next[more[:, 0]]], 1)
    q = torch.stack([draft.next[first[again]], torch.zeros(len(more), VOCAB)], 1)
    second[again] = verify_with_q(sample, rows, more, q, generator)[0][:, 0]
    return first, second, emitted.float().mean()


def without_residual_q(target, draft_tokens, widths, uniform, noise, draft_probs):
    """min(1, p/q) with the draft's q, but a rejected position drawn from p instead of max(0, p - q)."""
    drafted = draft_tokens >= 0
    x = draft_tokens.clamp(min=0)[:, None]
    p_x, q_x = target.gather(1, x)[:, 0], draft_probs.gather(1, x)[:, 0]
    accepted = drafted & (uniform * q_x < p_x)
    return torch.where(accepted, draft_tokens, (target / noise).argmax(dim=-1)), emitted_counts(
        accepted, widths
    )


def point_masses(target, draft_tokens, widths, uniform, noise, draft_probs):
    """The n-gram verifier's view of the same tokens: q(x) = 1."""
    return rejection_sample(target, draft_tokens, widths, uniform, noise)


def verify_with_q(sample, rows, drafts, q, generator):
    n, width, vocab = rows.shape
    draft_tokens = torch.cat([drafts, torch.full((n, 1), -1)], 1).reshape(-1)
    uniform = torch.rand(n * width, generator=generator)
    noise = torch.empty(n * width, vocab).exponential_(generator=generator)
    tokens, emitted = sample(
        rows.reshape(-1, vocab), draft_tokens, [width] * n, uniform, noise, q.reshape(-1, vocab)
    )
    return tokens.view(n, width), emitted


def test_a_draft_models_q_keeps_the_target_distribution():
    """A draft model's tokens come from its q: accepting them with min(1, p/q) and resampling
    max(0, p - q) keeps p, and accepts more than treating them as point masses would (both are
    lossless; q is what makes the draft pay); without the residual step the test fails."""
    generator = torch.Generator().manual_seed(2)
    target, draft = TinyTarget(generator), TinyDraft(generator)
    assert (draft.first - target.first).abs().max() > 0.1  # q really differs from p
    first, second, emitted = generate_two_from_a_draft(rejection_sample, target, draft, generator)
    assert chi_square(first, target.first) < CRITICAL_FIRST
    assert chi_square(first * VOCAB + second, target.joint()) < CRITICAL_JOINT
    _, _, emitted_as_points = generate_two_from_a_draft(point_masses, target, draft, generator)
    assert emitted > emitted_as_points
    first, second, _ = generate_two_from_a_draft(without_residual_q, target, draft, generator)
    assert chi_square(first, target.first) > CRITICAL_FIRST
    assert chi_square(first * VOCAB + second, target.joint()) > CRITICAL_JOINT


class TinyGrammar:
    """Which tokens a grammar allows first, and after each token (each row allows some)."""

    def __init__(self, generator):
        self.first = torch.rand(VOCAB, generator=generator) < 0.5
        self.next = torch.rand(VOCAB, VOCAB, generator=generator) < 0.5
        self.first[0] = True
        self.next[torch.arange(VOCAB), (torch.arange(VOCAB) + 1) % VOCAB] = True


def constrained(probs, allowed):
    """A distribution masked by the grammar, as the sampler's -inf logits make it."""
    kept = probs * allowed
    return kept / kept.sum(dim=-1, keepdim=True)


def verify_ragged(rows, q, drafts, lengths, generator):
    """rows, q [n, w, vocab]; drafts [n, w - 1]; each sample's first lengths[s] draft tokens are
    verified (its draft cut there): its tokens in a [n, w] grid and how many it emitted."""
    n, width, vocab = rows.shape
    used = torch.arange(width)[None, :] <= lengths[:, None]
    tokens = torch.cat([drafts, torch.full((n, 1), -1)], 1)
    tokens[torch.arange(n), lengths] = -1  # the bonus row, after the cut draft
    q = q.clone()
    q[torch.arange(n), lengths] = 0.0
    flat = int(used.sum())
    out, emitted = rejection_sample(
        rows[used],
        tokens[used],
        (lengths + 1).tolist(),
        torch.rand(flat, generator=generator),
        torch.empty(flat, vocab).exponential_(generator=generator),
        q[used],
    )
    grid = torch.full((n, width), -1)
    grid[used] = out
    return grid, emitted


def chi_square_on(tokens, probs, allowed):
    """The chi-square over the allowed outcomes; a token outside them makes it infinite."""
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    if observed[~allowed].any():
        return float("inf")
    expected = probs.reshape(-1).double()[allowed] * tokens.numel()
    return float(((observed[allowed] - expected) ** 2 / expected).sum())


def critical(allowed):
    return CRITICAL_BY_DF[int(allowed.sum()) - 1]


def generate_two_constrained(target, draft, grammar, scheme, generator):
    """Two tokens per sample under the grammar, the target's rows masked by it, and the mean tokens
    the first step emitted. The draft draws from q masked by the grammar ("masked": the proposer's
    scheme), or from its own q, its draft then verified whole ("whole": lossless, refused tokens
    are rejected) or cut before its first token the grammar refuses ("cut": not lossless)."""
    n = SAMPLES
    p_first, p_next = constrained(target.first, grammar.first), constrained(target.next, grammar.next)
    q_first, q_next = draft.first, draft.next
    if scheme == "masked":
        q_first, q_next = constrained(q_first, grammar.first), constrained(q_next, grammar.next)
    x1 = torch.multinomial(q_first.expand(n, VOCAB), 1, generator=generator)[:, 0]
    x2 = torch.multinomial(q_next[x1], 1, generator=generator)[:, 0]
    keep1 = grammar.first[x1] | (scheme == "whole")
    lengths = keep1.long() + (keep1 & (grammar.next[x1, x2] | (scheme == "whole"))).long()
    rows = torch.stack([p_first.expand(n, VOCAB), p_next[x1], p_next[x2]], 1)
    q = torch.stack([q_first.expand(n, VOCAB), q_next[x1], torch.zeros(n, VOCAB)], 1)
    grid, emitted = verify_ragged(rows, q, torch.stack([x1, x2], 1), lengths, generator)
    first, second = grid[:, 0], grid[:, 1].clone()
    again = emitted == 1
    before = first[again]
    more = torch.multinomial(q_next[before], 1, generator=generator)[:, 0]
    rows = torch.stack([p_next[before], p_next[more]], 1)
    q = torch.stack([q_next[before], torch.zeros(len(more), VOCAB)], 1)
    cut = (grammar.next[before, more] | (scheme == "whole")).long()
    second[again] = verify_ragged(rows, q, more[:, None], cut, generator)[0][:, 0]
    return first, second, p_first, p_first[:, None] * p_next, emitted.float().mean()


def test_a_grammar_constrained_draft_keeps_the_constrained_target_distribution():
    """Under a grammar the output must be the constrained target's: with q masked by the grammar
    (engine/draft_model_proposer.py) it is, and so with the draft's own q verified whole (refused
    tokens are rejected, at a cost in acceptance); drawing from the draft's own q and cutting the
    draft at its first refused token instead over-samples what the target emits at a cut, and fails."""
    generator = torch.Generator().manual_seed(3)
    target, draft, grammar = TinyTarget(generator), TinyDraft(generator), TinyGrammar(generator)
    emitted = {}
    for scheme in ("masked", "whole"):
        first, second, p_first, joint, emitted[scheme] = generate_two_constrained(
            target, draft, grammar, scheme, generator
        )
        assert grammar.first[first].all() and grammar.next[first, second].all()
        allowed_first, allowed_joint = p_first > 0, joint.reshape(-1) > 0
        observed = first * VOCAB + second
        assert chi_square_on(first, p_first, allowed_first) < critical(allowed_first), scheme
        assert chi_square_on(observed, joint, allowed_joint) < critical(allowed_joint), scheme
    assert emitted["masked"] > emitted["whole"]
    # The cut's bias shows in the pairs (the test's statistic there is over ten times the bound).
    first, second, _, _, _ = generate_two_constrained(target, draft, grammar, "cut", generator)
    assert chi_square_on(first * VOCAB + second, joint, allowed_joint) > critical(allowed_joint)
