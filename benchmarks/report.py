"""BENCHMARKS.md's tables, written from the committed JSON results so that no figure is copied by hand.

Each table is a `Table` in benchmarks/tables.py: the JSON files under benchmarks/results/ it reads, how
its rows come out of them, and its columns. In BENCHMARKS.md a table stands between
`<!-- table: NAME -->` and `<!-- /table -->`; this rewrites every such table from its JSON, and
`--check` only says which ones differ (a test runs it, so a table cannot drift from its JSON).

    .venv/bin/python -m benchmarks.report            # rewrite the tables
    .venv/bin/python -m benchmarks.report --check    # exit 1 if any is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.table_spec import RESULTS, Table
from benchmarks.tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
_BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.DOTALL)


def update(markdown: str, tables: Sequence[Table], results_dir: Path = RESULTS) -> str:
    """The markdown with every marked table rewritten; a marker without a spec is an error."""
    by_name = {t.name: t for t in tables}
    found = set()

    def rewrite(match: re.Match) -> str:
        name = match["name"]
        if name not in by_name:
            raise KeyError(f"BENCHMARKS.md marks a table {name!r} that benchmarks/tables.py does not define")
        found.add(name)
        return match[1] + by_name[name].render(results_dir) + match[4]

    updated = _BLOCK.sub(rewrite, markdown)
    missing = sorted(set(by_name) - found)
    if missing:
        raise KeyError(
            f"benchmarks/tables.py defines tables BENCHMARKS.md does not mark: {', '.join(missing)}"
        )
    return updated


def stale_tables(markdown: str, tables: Sequence[Table], results_dir: Path = RESULTS) -> list[str]:
    """Names of the marked tables whose text differs from what their JSON gives."""
    current = {m["name"]: m["body"] for m in _BLOCK.finditer(markdown)}
    fresh = {m["name"]: m["body"] for m in _BLOCK.finditer(update(markdown, tables, results_dir))}
    return [name for name in fresh if fresh[name] != current.get(name)]


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables; exit 1 if any")
    args = parser.parse_args(argv)
    markdown = BENCHMARKS_MD.read_text()
    if args.check:
        stale = stale_tables(markdown, TABLES)
        for name in stale:
            print(f"stale: {name} (run python -m benchmarks.report)")
        return 1 if stale else 0
    BENCHMARKS_MD.write_text(update(markdown, TABLES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
