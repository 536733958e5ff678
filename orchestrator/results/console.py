"""What the command lines print as tables (`specsweep`'s summary, `specsweep-report`, `specsweep-schedule`), on a
terminal or not.

    print_table(header, rows, *, title=None, console=None)   a rich table on a terminal; elsewhere tab-separated lines
    print_markdown(text, *, console=None)                    rendered on a terminal; elsewhere the Markdown as written

On a terminal rich fits a table to the window, folding or cutting cells with "…". Output that is not a terminal (a
pipe, a file, a CI log) has no window: rich would assume 80 columns and cut a timestamp to "2026-12-…", so there it is
written plain, every cell whole, one line per row (tabs between cells, so `cut -f` and spreadsheets read it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _console(console: Any | None) -> Any:
    if console is not None:
        return console
    from rich.console import Console

    return Console()


def _cell(value: object) -> str:
    return " ".join(str(value).split("\t")).replace("\n", " ")


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, title: str | None = None,
                console: Any | None = None) -> None:
    out = _console(console)
    if not out.is_terminal:
        lines = ([f"# {title}"] if title else []) + ["\t".join(map(_cell, r)) for r in [header, *rows]]
        out.file.write("\n".join(lines) + "\n")
        out.file.flush()
        return
    from rich.table import Table

    table = Table(*header, title=title, title_justify="left")
    for r in rows:
        table.add_row(*map(str, r))
    out.print(table)


def print_markdown(text: str, *, console: Any | None = None) -> None:
    out = _console(console)
    if not out.is_terminal:
        out.file.write(text.rstrip("\n") + "\n")
        out.file.flush()
        return
    from rich.markdown import Markdown

    out.print(Markdown(text))
