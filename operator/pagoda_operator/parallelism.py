"""Which tensor-parallel sizes a model splits into, as the operator asks it: before download by the
apiserver (a CEL rule generated from the model catalogue) and after it from the checkpoint's own
shape (in the status). The rule itself is the runtime's (`sizing.check_tensor_parallel`); this
module only applies it to every size a spec can ask for, so that both checks say the same sentence.
"""

from __future__ import annotations

from functools import cache

from pagoda_runtime.contract.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.contract.sizing import ModelArchitecture, check_tensor_parallel

from pagoda_operator.rules import Rule

# A node's GPUs: the most one pod asks for (8 on HGX/DGX machines).
MAX_GPUS_PER_POD = 8
# Pods one replica may span (a LeaderWorkerSet group).
MAX_NODES = 16
MAX_TENSOR_PARALLEL_SIZE = MAX_GPUS_PER_POD * MAX_NODES
# Each GPU runs one rank and a CPU pod one; the apiserver has filled the defaults in by then.
RANKS_PER_POD_CEL = "(self.resources.gpus > 0 ? self.resources.gpus : 1)"
TENSOR_PARALLEL_SIZE_CEL = f"({RANKS_PER_POD_CEL} * self.parallelism.nodes)"


@cache
def tensor_parallel_sizes(arch: ModelArchitecture) -> tuple[int, ...]:
    """The sizes whose ranks each get whole attention heads, key/value heads (or one copy of one)
    and MLP channels."""
    sizes = []
    for size in range(1, MAX_TENSOR_PARALLEL_SIZE + 1):
        try:
            check_tensor_parallel(arch, size)
        except ValueError:
            continue
        sizes.append(size)
    return tuple(sizes)


def _listed(sizes: tuple[int, ...]) -> str:
    return ", ".join(map(str, sizes))


def split_message(size: int | None, subject: str, sizes: tuple[int, ...]) -> str:
    """The one sentence both checks say: what does not split, and the sizes that do; `size` is
    named where it is known (the apiserver's messages are fixed strings)."""
    named = f"parallelism.tensor {size}" if size is not None else "parallelism.tensor"
    return (
        f"{named} (resources.gpus x parallelism.nodes) does not split {subject} evenly over its ranks "
        f"(attention heads, key/value heads, MLP); use one of {_listed(sizes)}"
    )


def split_error(arch: ModelArchitecture, size: int, quantization: str) -> str | None:
    """Why `size` ranks cannot hold `arch` with `quantization` (grouped formats must split at group
    boundaries too), or None when they can."""
    sizes = tensor_parallel_sizes(arch)
    if size not in sizes:
        return split_message(size, "the model", sizes)
    try:
        check_tensor_parallel(arch, size, quantization)
    except ValueError as exc:
        return f"parallelism.tensor {size}: {exc}"
    return None


def _family_rule(family: str, arch: ModelArchitecture) -> Rule:
    sizes = tensor_parallel_sizes(arch)
    return Rule(
        f"!has(self.model.family) || self.model.family != '{family}' || {TENSOR_PARALLEL_SIZE_CEL} in "
        f"{list(sizes)}",
        lambda spec: spec.model.family != family or spec.tensor_parallel_size in sizes,
        split_message(None, f"model family {family}", sizes),
    )


# The catalogue families' head counts are known before any download: the apiserver refuses a size
# that does not divide them, naming the sizes that do. One rule per family, each with a fixed
# message: a message built from a lookup exceeds the apiserver's CEL cost budget.
FAMILY_SPLIT_RULES = tuple(_family_rule(family, arch) for family, arch in KNOWN_ARCHITECTURES.items())
