"""The Markdown table of the chart's values, generated from its values.schema.json.

`python -m hvconform.manifests.values_table` prints it; README.md and the chart's README.md
carry it, and tests/chart checks that both match the schema.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hvconform.manifests.chart import chart_dir


def value_leaves(
    schema: Mapping[str, Any], prefix: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(dotted key, schema) of every value an operator sets, in the schema's order."""
    for name, sub in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub and "default" not in sub:
            yield from value_leaves(sub, key + ".")
        else:
            yield key, sub


def _type(sub: Mapping[str, Any]) -> str:
    if "enum" in sub:
        return " or ".join(f"`{v}`" for v in sub["enum"])
    kind = sub.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def values_table(schema: Mapping[str, Any] | None = None) -> str:
    """The Markdown table of the chart's values, generated from values.schema.json."""
    if schema is None:
        schema = json.loads((chart_dir() / "values.schema.json").read_text())
    rows = ["| value | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, sub in value_leaves(schema):
        default = json.dumps(sub.get("default"), separators=(", ", ": "))
        meaning = str(sub.get("description", "")).replace("|", "\\|")
        rows.append(f"| `{key}` | {_type(sub)} | `{default}` | {meaning} |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; no arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print("usage: python -m hvconform.manifests.values_table", file=sys.stderr)
        return 2
    sys.stdout.write(values_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
