"""Progress bars on stderr (tqdm); silent when asked, or when stderr is not a terminal."""

from __future__ import annotations

import sys
import weakref

from tqdm.auto import tqdm

_open_bars: "weakref.WeakSet[tqdm]" = weakref.WeakSet()


def progress_bar(iterable=None, *, desc: str, enabled: bool = True, **kwargs):
    bar = tqdm(
        iterable,
        desc=desc,
        file=sys.stderr,
        disable=(not enabled) or None,  # None: tqdm turns itself off when stderr is not a TTY
        dynamic_ncols=True,
        **kwargs,
    )
    _open_bars.add(bar)
    return bar


def close_bars() -> None:
    """Close every bar still open, so that an error printed next stands on its own line and no bar is
    drawn after it (a closed bar stays as it was, ending its line)."""
    for bar in list(_open_bars):
        bar.close()
    _open_bars.clear()


def status(message: str) -> None:
    """A step note on stderr for long steps with no natural count; only on a terminal, like the bars."""
    if sys.stderr.isatty():
        print(f"... {message}", file=sys.stderr, flush=True)
