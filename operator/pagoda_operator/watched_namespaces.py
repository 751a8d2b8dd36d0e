"""Which namespaces the operator watches: its --namespace patterns (the chart's
operator.watchNamespaces), matched exactly as kopf matches them, so that the operator's own work
(the upgrade gate, the peering objects) covers the namespaces kopf serves and no others."""

from __future__ import annotations

# kopf's matcher itself: globs, comma-separated alternatives and `!` exclusions, as `kopf run
# --namespace` documents them.
from kopf._cogs.structs.references import match_namespace


def watched(namespace: str, patterns: tuple[str, ...]) -> bool:
    """Whether an operator started with these --namespace patterns watches `namespace`; with none it
    watches every namespace."""
    return not patterns or any(match_namespace(namespace, pattern) for pattern in patterns)
