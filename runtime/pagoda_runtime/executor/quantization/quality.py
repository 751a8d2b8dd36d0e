"""How much a quantized model's predictions move: perplexity, top-1 agreement and mean KL.

All three take next-token logits [T, V] for the same tokens, so they work with any model that can
score a text (our engine's model, or a Hugging Face one in tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class QualityReport:
    perplexity: float
    top1_agreement: float  # fraction of positions whose argmax equals the reference's
    mean_kl: float  # mean over positions of KL(reference || model), in nats


def perplexity(logits: torch.Tensor, token_ids: torch.Tensor) -> float:
    """exp of the mean cross-entropy of predicting token_ids[1:] from logits[:-1]."""
    loss = F.cross_entropy(logits[:-1].float(), token_ids[1:].to(logits.device))
    return float(torch.exp(loss))


def compare(reference_logits: torch.Tensor, logits: torch.Tensor, token_ids: torch.Tensor) -> QualityReport:
    ref = F.log_softmax(reference_logits.float(), dim=-1)
    test = F.log_softmax(logits.float(), dim=-1)
    kl = (ref.exp() * (ref - test)).sum(dim=-1)
    agreement = (ref.argmax(dim=-1) == test.argmax(dim=-1)).float().mean()
    return QualityReport(perplexity(logits, token_ids), float(agreement), float(kl.mean()))
