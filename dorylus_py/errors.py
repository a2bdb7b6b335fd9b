"""User-facing errors.

Anything a user can cause (bad files, bad flags, bad messages) raises a subclass of
:class:`DorylusError` with a one-line message naming the thing and the problem. The CLI prints it
and exits with code 2; no traceback.
"""


class DorylusError(Exception):
    """An error caused by input, reported to the user as one line."""


class DataError(DorylusError):
    """A dataset or partition file is missing, malformed or inconsistent."""


class ConfigError(DorylusError):
    """A flag or configuration value is out of range or contradicts another."""


def interrupted_by_user(error: BaseException) -> bool:
    """Ctrl-C is behind ``error``: it is a KeyboardInterrupt, or was raised while handling one."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False
