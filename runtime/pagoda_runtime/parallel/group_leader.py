"""Rank 0 of a tensor-parallel group on the leader node, as the serving process and the offline
`LLM` both start it: this node's other ranks spawned (rank_worker.spawned_rank), the group joined,
the engine built on rank 0's share of the model, and led once every rank has loaded.
"""

from __future__ import annotations

from pagoda_runtime.engine.llm_engine import LLMEngine
from pagoda_runtime.parallel.rank_group import RankGroup
from pagoda_runtime.parallel.rank_worker import spawned_rank


def lead_group(group: RankGroup) -> LLMEngine:
    """The engine of rank 0, ready once every rank holds its part of the model; from then on each
    step goes to the other ranks first. `group.finish` ends them."""
    group.start(spawned_rank)
    member = group.join(0)
    engine = LLMEngine(member.engine_config, tp=member.tp, layout=group.world.describe())
    group.lead(member, engine.runner, engine.draft_runner)
    return engine
