"""What a speculative proposer's own model computes: the tokens each of its forwards runs."""


def count_tokens_run(proposer) -> list[int]:
    """A list that each forward of the proposer's runner (catch-up or draft step) appends its number
    of new tokens to, from now on."""
    ran: list[int] = []
    forward = proposer.runner.forward_logits

    def counted(batch):
        ran.append(sum(batch.num_new_tokens))
        return forward(batch)

    proposer.runner.forward_logits = counted
    return ran
