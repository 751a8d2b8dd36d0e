"""The rejection sampler keeps the target's distribution whatever the draft: a chi-square test on a
tiny vocabulary, strong enough that a sampler without the residual step fails it."""

import torch
from pagoda_runtime.executor.rejection_sampler import emitted_counts, rejection_sample, target_probs
from pagoda_runtime.executor.sampler import truncation_mask

VOCAB = 5
SAMPLES = 20_000
# Chi-square critical values at significance 0.001 (the test fails a correct sampler once in a
# thousand seeds; the seed is fixed, so it is deterministic): 4 and 24 degrees of freedom.
CRITICAL_FIRST = 18.467
CRITICAL_JOINT = 51.179


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
