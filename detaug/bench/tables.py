"""The printed tables of ``detaug bench``: columns aligned, a rule under the header."""

from __future__ import annotations

__all__ = ["format_table"]



def format_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Printed lines of a table: ``rows[0]`` the header; the first column left-aligned, the
    middle ones right-aligned, the last (a note) as it is; a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:-1], widths[1:])]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
        if k == 0:
            lines.append("-" * len(lines[-1]))
    return lines
