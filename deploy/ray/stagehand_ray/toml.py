"""Writes the small subset of TOML a `stagehand serve` config uses: top-level keys,
tables (`[limits]`, `[budget]`, `[admin]`), arrays of tables (`[[models]]`) and inline
tables (`adapters = { NAME = "FILE" }`), of strings, numbers, booleans and lists.
Python reads TOML (tomllib) but does not write it."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no TOML spelling here")
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a valid TOML basic string (same escapes).
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _key(key: str) -> str:
    if key and all(c.isalnum() or c in "-_" for c in key):
        return key
    return json.dumps(key)


def dumps(document: Mapping[str, Any]) -> str:
    """The document as TOML: scalars first, then tables, then arrays of tables."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list]] = []
    for key, value in document.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((key, value))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            arrays.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, table in tables:
        lines.append("")
        lines.append(f"[{_key(key)}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None)
    for key, items in arrays:
        for item in items:
            lines.append("")
            lines.append(f"[[{_key(key)}]]")
            lines.extend(f"{_key(k)} = {_value(v)}" for k, v in item.items() if v is not None)
    return "\n".join(lines) + "\n"
