"""Which tensor-parallel sizes a model splits into, as the operator asks it: from the shape the spec
names (a catalogue family or an explicit architecture) or, once downloaded, from the checkpoint's
own (plan.py; a variant that does not split gets status InvalidParallelism and no pods). The rule
itself is the runtime's (`sizing.check_tensor_parallel`); this module only applies it to every size
a spec can ask for, so that the status names the sizes that do split. The CRD keeps only the
generic rules: one rule per family would grow it with every model the catalogue learns.
"""

from __future__ import annotations

from functools import cache

from pagoda_runtime.contract.sizing import ModelArchitecture, check_tensor_parallel

# A node's GPUs: the most one pod asks for (8 on HGX/DGX machines).
MAX_GPUS_PER_POD = 8
# Pods one replica may span (a LeaderWorkerSet group).
MAX_NODES = 16
MAX_TENSOR_PARALLEL_SIZE = MAX_GPUS_PER_POD * MAX_NODES
# Each GPU runs one rank and a CPU pod one; the apiserver has filled the defaults in by then.
RANKS_PER_POD_CEL = "(self.resources.gpus > 0 ? self.resources.gpus : 1)"


@cache
def tensor_parallel_sizes(arch: ModelArchitecture) -> tuple[int, ...]:
    """The sizes whose ranks each get whole attention heads, key/value heads (or one copy of one),
    MLP channels and every expert's channels."""
    sizes = []
    for size in range(1, MAX_TENSOR_PARALLEL_SIZE + 1):
        try:
            check_tensor_parallel(arch, size)
        except ValueError:
            continue
        sizes.append(size)
    return tuple(sizes)


def split_message(size: int, sizes: tuple[int, ...]) -> str:
    """What does not split, and the sizes that do."""
    return (
        f"parallelism.tensor {size} (resources.gpus x parallelism.nodes) does not split the model evenly "
        f"over its ranks (attention heads, key/value heads, MLP); use one of {', '.join(map(str, sizes))}"
    )


def split_error(arch: ModelArchitecture, size: int, quantization: str) -> str | None:
    """Why `size` ranks cannot hold `arch` with `quantization` (grouped formats must split at group
    boundaries too), or None when they can."""
    sizes = tensor_parallel_sizes(arch)
    if size not in sizes:
        return split_message(size, sizes)
    try:
        check_tensor_parallel(arch, size, quantization)
    except ValueError as exc:
        return f"parallelism.tensor {size}: {exc}"
    return None
