"""docs/bench-json.md against a real ``detaug bench --json`` file: every key the file holds is
named in the page's block for its mode, and the page's schema is the file's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[3] / "docs" / "bench-json.md"

#: Keys whose children are data, not fields: reasons, recipe names, package names.
DATA_KEYS = frozenset({"left_out", "sizes", "versions"})


def _block(mode: str) -> str:
    """The page's ``text`` block for ``mode``: the rows timed alone (``"alone"``) or ``"train"``."""
    blocks = re.findall(r"```text\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2, f"{DOC}: expected two text blocks (the rows timed alone, --train), got {len(blocks)}"
    return blocks[0 if mode == "alone" else 1]


def keys_of(value: Any) -> set[str]:
    """Every dict key in ``value``, at any depth (not below :data:`DATA_KEYS`)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, child in value.items():
            found.add(key)
            if key not in DATA_KEYS:
                found |= keys_of(child)
    elif isinstance(value, list):
        for child in value:
            found |= keys_of(child)
    return found


def check_documented(results: dict, mode: str) -> None:
    """Fails naming the keys of ``results`` that docs/bench-json.md's block for ``mode`` leaves
    out, or a schema that differs."""
    block = _block(mode)
    named = block if mode == "alone" else block + _block("alone")  # --train's "as above"
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", named))
    missing = sorted(keys_of(results) - words)
    assert not missing, f"{DOC.name} ({mode}) does not name {', '.join(missing)}"
    schema = re.search(r'schema\s+"([^"]+)"', block)
    assert schema and schema.group(1) == results["schema"], (schema and schema.group(1), results["schema"])
