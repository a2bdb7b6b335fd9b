"""Progress bars on stderr (tqdm); silent when asked, or when stderr is not a terminal."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress_bar(iterable=None, *, desc: str, enabled: bool = True, **kwargs):
    return tqdm(
        iterable,
        desc=desc,
        file=sys.stderr,
        disable=(not enabled) or None,  # None: tqdm turns itself off when stderr is not a TTY
        dynamic_ncols=True,
        **kwargs,
    )


def status(message: str) -> None:
    """A step note on stderr for long steps with no natural count; only on a terminal, like the bars."""
    if sys.stderr.isatty():
        print(f"... {message}", file=sys.stderr, flush=True)
