"""How deep a JSON body nests, measured on its bytes before anything parses it.

Parsers and validators walk nested values recursively (Python's json, the server's own scans,
JSON-schema compilers), and a body nested a thousand levels deep reaches Python's recursion limit
in one of them. The edge refuses such a body first, naming the top-level field it nests in. The
measure runs at C speed (regular expressions, bytes.translate, numpy), so a body of many megabytes
costs milliseconds; only a body found too deep is walked token by token, to name its field.
"""

from __future__ import annotations

import json
import re

import numpy as np

# The deepest nesting a request may have: far beyond any real request (a tool's JSON schema nests a
# few levels per object), far below Python's recursion limit of 1000.
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = np.zeros(256, dtype=np.int32)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
# A string and whether a colon follows it (a key), or a bracket.
_TOKEN = re.compile(rb'("(?:[^"\\]|\\.)*")(\s*:)?|[\[\]{}]')


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> tuple[bool, str | None]:
    """(whether the body nests deeper than `limit`, the top-level field where it does, if any)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False, None  # it cannot nest deeper than it opens
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)  # brackets in strings do not nest
    depth = np.cumsum(_STEP[np.frombuffer(brackets, dtype=np.uint8)])
    if depth.max(initial=0) <= limit:
        return False, None
    return True, _field_too_deep(body, limit)


def _field_too_deep(body: bytes, limit: int) -> str | None:
    """The key of the top-level member that nests deeper than `limit`; None in a top-level array."""
    depth, key = 0, None
    for token in _TOKEN.finditer(body):
        if token.group(1) is not None:
            if depth == 1 and token.group(2) is not None:
                key = token.group(1)
        elif token.group() in b"[{":
            depth += 1
            if depth > limit:
                break
        else:
            depth -= 1
    try:
        name = json.loads(key) if key is not None else None
    except ValueError:
        return None
    return name if isinstance(name, str) else None
