"""Which tensor-parallel sizes a model splits into, as the operator asks it: before download by the
apiserver (a CEL rule generated from the model catalogue) and after it from the checkpoint's own
shape (in the status). The rule itself is the runtime's (`sizing.check_tensor_parallel`); this
module only applies it to every size a spec can ask for, so that both checks say the same sentence.
"""

from __future__ import annotations

from functools import cache

from pagoda_runtime.model_catalogue import KNOWN_ARCHITECTURES
from pagoda_runtime.sizing import ModelArchitecture, check_tensor_parallel

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


def split_message(size: int, subject: str, sizes: tuple[int, ...]) -> str:
    """The one sentence both checks say: the size, what it does not split, and the sizes that do."""
    return (
        f"parallelism.tensor {size} (resources.gpus x parallelism.nodes) does not split {subject} evenly "
        f"over its ranks (attention heads, key/value heads, MLP); use one of {_listed(sizes)}"
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


def _family_map(value) -> str:
    entries = ", ".join(f"'{family}': {value(arch)}" for family, arch in KNOWN_ARCHITECTURES.items())
    return "{" + entries + "}"


def _family_splits(spec) -> bool:
    family = spec.model.family
    return family is None or spec.tensor_parallel_size in tensor_parallel_sizes(KNOWN_ARCHITECTURES[family])


def _family_message(spec) -> str:
    family = spec.model.family
    sizes = tensor_parallel_sizes(KNOWN_ARCHITECTURES[family])
    return split_message(spec.tensor_parallel_size, f"model family {family}", sizes)


# The families' head counts are known before any download: the apiserver refuses a size that does
# not divide them, naming the sizes that do.
FAMILY_SPLIT_RULE = Rule(
    f"!has(self.model.family) || {TENSOR_PARALLEL_SIZE_CEL} in "
    + _family_map(lambda arch: list(tensor_parallel_sizes(arch)))
    + "[self.model.family]",
    _family_splits,
    "parallelism.tensor (resources.gpus x parallelism.nodes) does not split the model family evenly "
    "over its ranks (attention heads, key/value heads, MLP)",
    message_expression=(
        f"'parallelism.tensor ' + string({TENSOR_PARALLEL_SIZE_CEL}) + ' (resources.gpus x "
        "parallelism.nodes) does not split model family ' + self.model.family + ' evenly over its "
        "ranks (attention heads, key/value heads, MLP); use one of ' + "
        + _family_map(lambda arch: repr(_listed(tensor_parallel_sizes(arch))))
        + "[self.model.family]"
    ),
    describe=_family_message,
)
