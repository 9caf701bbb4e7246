"""Progress bars (rich) that library code can use without knowing whether anyone watches."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)
_enabled = True


def set_enabled(flag: bool) -> None:
    """Turn progress bars on or off (tests and `--quiet` turn them off)."""
    global _enabled
    _enabled = flag


def is_enabled() -> bool:
    return _enabled


def bars_visible() -> bool:
    return _enabled and (console.is_terminal or console.is_jupyter)


@contextmanager
def task(description: str | None, total: int | None) -> Iterator[Callable[..., None]]:
    """A progress bar for one phase; yields `advance(n=1, **fields)`. No bar when the
    description is None, when bars are disabled, or when stderr is not a terminal."""
    if description is None or not bars_visible():
        yield lambda n=1, **kw: None
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as bar:
        tid = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, **fields: object) -> None:
            info = "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
            bar.update(tid, advance=n, info=info)

        yield advance


def warn(message: str) -> None:
    """A warning on stderr, `warning: MESSAGE`: shown under --quiet too (which only removes progress bars
    and the running log), since it says something the user has to know about the run."""
    console.print(f"[yellow]warning[/]: {message}", soft_wrap=not console.is_terminal)


def log(message: str) -> None:
    """One message on stderr: wrapped to a terminal's width, one unbroken line in a pipe or a log
    file (where a wrap would split numbers and paths)."""
    if _enabled:
        console.print(message, soft_wrap=not console.is_terminal)
