"""Whether the Lambda image's pip installs find wheels for the image's own platform: what no test that
installs for this machine's platform sees, and moto never builds.

A manylinux_2_N wheel needs glibc 2.N or newer; the base image fixes glibc (Amazon Linux 2: 2.26,
Amazon Linux 2023: 2.34) and, unless it is an OS-only image, the Python. ``read`` takes both from the
Dockerfile's ``FROM`` (an unknown base image is refused, never guessed) and the pins of each ``pip
install`` it runs; ``fits``/``refusals`` decide, in pure code, whether given wheel files install there;
``resolve`` asks pip's own resolver for that platform (``pip install --dry-run --report``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from dorylus_py import children
from dorylus_py.errors import ConfigError

# base image -> (what it is, glibc minor version (2.N), its Python or "" for an OS-only image)
BASE_IMAGES = {
    "public.ecr.aws/lambda/python:3.11": ("Amazon Linux 2", 26, "3.11"),
    "public.ecr.aws/lambda/python:3.12": ("Amazon Linux 2023", 34, "3.12"),
    "public.ecr.aws/lambda/python:3.13": ("Amazon Linux 2023", 34, "3.13"),
    "public.ecr.aws/lambda/provided:al2": ("Amazon Linux 2", 26, ""),
    "public.ecr.aws/lambda/provided:al2023": ("Amazon Linux 2023", 34, ""),
}
ARCH = "x86_64"  # docker build --platform linux/amd64; the function's default architecture


@dataclass(frozen=True)
class Install:
    pins: tuple[str, ...]  # name==version, as the Dockerfile writes them
    index_url: str  # "" for pip's default index


@dataclass(frozen=True)
class Image:
    base: str
    system: str
    glibc: int  # 2.N
    python: str  # "3.11"
    installs: tuple[Install, ...]

    def describe(self) -> str:
        return f"{self.system} (glibc 2.{self.glibc}, CPython {self.python}, {ARCH})"


def read(dockerfile: str) -> Image:
    """The base image's platform and the pip installs of a Dockerfile's text."""
    text = dockerfile.replace("\\\n", " ")
    bases = re.findall(r"^FROM\s+(\S+)", text, re.M)
    if len(bases) != 1 or bases[0] not in BASE_IMAGES:
        raise ConfigError(f"Dockerfile: base image {bases} is not one whose glibc is known here ({', '.join(BASE_IMAGES)})")
    system, glibc, python = BASE_IMAGES[bases[0]]
    runs = [line[4:] for line in text.splitlines() if line.startswith("RUN ")]
    if not python:  # an OS-only image: the Python its package manager installs
        found = re.findall(r"\bdnf install\b[^&;]*\bpython(3\.\d+)\b", " ".join(runs))
        if len(set(found)) != 1:
            raise ConfigError(f"Dockerfile: {bases[0]} has no Python of its own; dnf installs {sorted(set(found)) or 'none'}")
        python = found[0]
    installs = []
    for run in runs:
        for command in re.split(r"&&|;", run):
            words = shlex.split(command)
            if "pip" in words and "install" in words:
                pins = tuple(w for w in words if re.fullmatch(r"[A-Za-z][\w.-]*==[\w.+!]+", w))
                index = words[words.index("--index-url") + 1] if "--index-url" in words else ""
                installs.append(Install(pins, index))
    if not installs:
        raise ConfigError("Dockerfile: no pip install found")
    return Image(bases[0], system, glibc, python, tuple(installs))


def platforms(glibc: int) -> list[str]:
    """The platform tags pip accepts on glibc 2.``glibc``, newest first (the legacy aliases included)."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out = []
    for minor in range(glibc, 4, -1):
        out.append(f"manylinux_2_{minor}_{ARCH}")
        if minor in legacy:
            out.append(f"{legacy[minor]}_{ARCH}")
    return out + [f"linux_{ARCH}"]


def fits(wheel: str, image: Image) -> bool:
    """Whether pip in ``image`` would install the wheel file named ``wheel``."""
    version = tuple(int(x) for x in image.python.split("."))
    accepted = set(cpython_tags(version, platforms=platforms(image.glibc))) | \
        set(compatible_tags(version, f"cp{version[0]}{version[1]}", platforms(image.glibc)))
    return bool(parse_wheel_filename(wheel)[3] & accepted)


def refusals(image: Image, wheels: dict[str, list[str]]) -> list[str]:
    """One line per pin none of whose wheel files (``wheels[pin]``) installs in ``image``."""
    out = []
    for pin, files in wheels.items():
        if files and not any(fits(f, image) for f in files):
            tags = sorted({str(t.platform) for f in files for t in parse_wheel_filename(f)[3]})
            out.append(f"{pin}: no wheel installs on {image.describe()}; its wheels are for {', '.join(tags)}")
    return out


def resolve(image: Image, install: Install, glibc: int | None = None, timeout_s: float = 600) -> tuple[list[str], str]:
    """pip's resolver for ``install`` on the image's platform (glibc 2.``glibc`` if given, None: the
    image's), dependencies included, nothing downloaded beyond metadata: (the wheel files it would
    install, "") or ([], pip's error)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = children.module("pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--report", report,
                               "--target", Path(tmp) / "t", "--only-binary=:all:", "--python-version", image.python,
                               "--implementation", "cp", "--abi", f"cp{image.python.replace('.', '')}", "--timeout", "15",
                               "--retries", "1", "--disable-pip-version-check")
        argv += [a for p in platforms(image.glibc if glibc is None else glibc) for a in ("--platform", p)]
        argv += ["--index-url", install.index_url] if install.index_url else []
        proc = subprocess.run(argv + list(install.pins), capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode:
            return [], "\n".join(line for line in proc.stderr.splitlines() if line.startswith("ERROR"))
        items = json.loads(report.read_text())["install"]
        return [i["download_info"]["url"].rsplit("/", 1)[-1].replace("%2B", "+") for i in items], ""


def refused_pin(install: Install, error: str) -> str:
    """The pin pip's error names (``No matching distribution found for X``, ``Cannot install X``)."""
    found = re.search(r"(?:found for|Cannot install) ([^\s;]+)", error)
    name = found.group(1).split("==")[0].lower() if found else ""
    return next((p for p in install.pins if p.split("==")[0].lower() == name), found.group(1) if found else error)
