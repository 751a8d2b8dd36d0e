"""How an embedding model's folder says it pools, as sentence-transformers reads it: modules.json
lists the modules after the transformer, a sentence_transformers.models.Pooling module (its
config.json's pooling_mode_* flags) and, where the vectors are unit length, a Normalize module
(Qwen3-Embedding: last token, normalized; e5 and gte: mean, normalized)."""

from __future__ import annotations

import json
from pathlib import Path

from pagoda_runtime.contract.pooling import PoolerConfig

# pooling_mode_* flag -> contract/pooling.POOLING_TYPES
_MODES = {
    "pooling_mode_lasttoken": "LAST",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_cls_token": "CLS",
}


class PoolingConfigError(ValueError):
    """A folder whose sentence-transformers files ask for pooling Pagoda does not do."""


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PoolingConfigError(f"{path} cannot be read as JSON ({exc}); download the model again") from exc


def read_pooling(folder: Path) -> PoolerConfig | None:
    """The pooling the folder's modules.json describes; None where it has none."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    modules = _read(modules_file)
    if not isinstance(modules, list):
        raise PoolingConfigError(f"{modules_file} is not a list of modules; download the model again")
    kind, normalize = None, False
    for module in modules:
        module_type = module.get("type", "") if isinstance(module, dict) else ""
        if module_type.endswith("models.Normalize"):
            normalize = True
        elif module_type.endswith("models.Pooling"):
            config_file = folder / module.get("path", "") / "config.json"
            config = _read(config_file)
            modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v is True)
            if len(modes) != 1 or modes[0] not in _MODES:
                raise PoolingConfigError(
                    f"{config_file} pools by {', '.join(modes) or 'nothing'}; Pagoda pools by one of "
                    f"{', '.join(_MODES)} (--pooler-config sets one)"
                )
            kind = _MODES[modes[0]]
    return PoolerConfig(kind, normalize)
