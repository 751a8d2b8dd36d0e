"""Which tensor-parallel rank this process is, and the collectives the sharded model calls.

`TensorParallel()` is the single-process default: every collective returns its input untouched and
every shard is the whole, so the model runs exactly as it did before sharding. With `size > 1`,
`group` is the torch.distributed process group of the ranks (NCCL on GPUs, gloo on the CPU) and
every rank must call each collective in the same order, which the model's forward guarantees as
long as every rank runs the same batch.

The collectives never synchronize with the host and write into tensors of fixed shapes, so a CUDA
graph captured on NCCL replays them (the decode graphs of model_runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from pagoda_runtime.contract.sizing import split_evenly


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: object | None = None  # a torch.distributed ProcessGroup; None for size 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} of {self.size} is not a rank of that group")
        if self.size > 1 and self.group is None:
            raise ValueError("a tensor-parallel group of more than one rank needs its process group")

    @classmethod
    def joined(cls, group: object | None = None) -> TensorParallel:
        """This process's place in `group` (the default group when None), once torch.distributed is
        initialized; the single-process default when it is not."""
        if not dist.is_initialized():
            return cls()
        group = group if group is not None else dist.group.WORLD
        size = dist.get_world_size(group)
        return cls(dist.get_rank(group), size, group if size > 1 else None)

    @property
    def is_driver(self) -> bool:
        """Rank 0: the one that samples, schedules and serves; the others only compute."""
        return self.rank == 0

    # ---- sharding arithmetic -----------------------------------------------------------------

    def shard(self, n: int, what: str) -> int:
        """How many of n things (heads, channels) each rank holds; raises if n does not split."""
        return split_evenly(n, self.size, what)

    def part(self, n: int, what: str) -> slice:
        """The indices of n things this rank holds."""
        per_rank = self.shard(n, what)
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def rows_of_parts(self, tensor: torch.Tensor, sizes: tuple[int, ...], what: str) -> torch.Tensor:
        """This rank's rows of a tensor whose rows are consecutive parts of `sizes` rows, each split
        over the ranks (a fused column-parallel projection, a convolution over those channels)."""
        if self.size == 1:
            return tensor
        pieces, start = [], 0
        for rows in sizes:
            part = self.part(rows, what)
            pieces.append(tensor[start + part.start : start + part.stop])
            start += rows
        return torch.cat(pieces)

    # ---- collectives -------------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks, in place (the partial outputs of a row-parallel layer)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's x, concatenated along `dim` in rank order (the vocabulary slices of the
        logits). Every rank gets the whole: only rank 0 samples from it, but gathering to all keeps
        one collective that NCCL and gloo both implement and CUDA graphs capture."""
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def agree_min(self, n: int, device: torch.device) -> int:
        """The smallest n over the ranks: a figure (the KV block count) every rank must share."""
        if self.size == 1:
            return n
        value = torch.tensor([n], dtype=torch.int64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return int(value.item())


# The default of every signature that takes a rank: one process, no collectives.
SINGLE_PROCESS = TensorParallel()
