"""The pieces every ``dorylus`` command's parser is made of: argparse reporting a usage mistake as one
line, and a subcommand's parser. Only the standard library is imported (``--help`` stays fast)."""

from __future__ import annotations

import argparse

from dorylus_py.errors import ConfigError


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line, not the usage block."""

    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def command(sub, name: str, help: str, parents=(), epilog: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=help,
        parents=list(parents),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
