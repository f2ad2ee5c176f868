"""The generated table of transforms in docs/transforms.md, from the registry and the schemas.

``python -m detaug.transforms.table`` rewrites the part of docs/transforms.md between the
``<!-- transforms-table -->`` markers; a test checks the file is up to date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from detaug.transforms import TRANSFORMS
from detaug.transforms.schema import REQUIRED

__all__ = ["markdown_table", "update_docs"]

BEGIN, END = "<!-- transforms-table -->", "<!-- /transforms-table -->"
KIND_TEXT = {"warp": "geometry (image and boxes)", "photometric": "pixels only",
             "output": "output stage (last)", "mixing": "several images", "composition": "composition"}


def _value(value: object) -> str:
    if value is REQUIRED:
        return "required"
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def markdown_table() -> str:
    """One section per transform: its first docstring line, kind and a table of its fields."""
    out = []
    for name in sorted(TRANSFORMS, key=lambda n: (list(KIND_TEXT).index(TRANSFORMS[n].kind)
                                                 if TRANSFORMS[n].kind in KIND_TEXT else 99, n)):
        cls = TRANSFORMS[name]
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        out.append(f"### {name}\n\n{KIND_TEXT.get(cls.kind, cls.kind)}. {doc}\n")
        if cls.schema:
            out.append("| field | type | default | meaning |\n|---|---|---|---|")
            for p in cls.schema:
                out.append(f"| `{p.name}` | {p.expected()} | `{_value(p.default)}` | {p.doc} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def update_docs(path: str | Path) -> bool:
    """Rewrite the table in ``path``; ``True`` when the file changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{markdown_table()}{END}{tail}"
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "docs/transforms.md"
    print(f"{target}: {'updated' if update_docs(target) else 'up to date'}")
