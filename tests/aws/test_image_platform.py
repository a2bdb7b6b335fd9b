"""The Lambda image's pins install on the image's own platform (glibc, Python), which neither moto nor
tests/aws/test_lambda_image.py (it installs for this machine) can see: pip's resolver for that platform
when an index answers, the wheels at hand otherwise; a refusal names the package."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

from dorylus_py.errors import ConfigError
from dorylus_py.rehearsal.image_platform import Image, Install, read, refusals, refused_pin, resolve

DOCKERFILE = Path(__file__).resolve().parents[2] / "lambda_functions" / "Dockerfile"
# The Dockerfile before issue 43: AWS's Python 3.11 base image, which is Amazon Linux 2 (glibc 2.26).
AL2_DOCKERFILE = """FROM public.ecr.aws/lambda/python:3.11
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \\
 && pip install --no-cache-dir numpy==2.4.6 pyzmq==27.3.0 cryptography==50.0.2 boto3==1.43.117
CMD ["lambda_functions.handler.handler"]
"""
# The files the indexes hold for these versions (pip's report; PyPI's and download.pytorch.org's listings).
WHEELS = {"torch==2.13.0": ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                            "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl"],
          "numpy==2.4.6": ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
                           "numpy-2.4.6-cp311-cp311-musllinux_1_2_x86_64.whl"],
          "pyzmq==27.3.0": ["pyzmq-27.3.0-cp311-cp311-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl"],
          "boto3==1.43.117": ["boto3-1.43.117-py3-none-any.whl"]}


def test_the_python_3_11_base_image_is_refused_naming_torch_and_numpy():
    old, new = read(AL2_DOCKERFILE), read(DOCKERFILE.read_text())
    assert (old.system, old.glibc, old.python) == ("Amazon Linux 2", 26, "3.11")
    assert (new.system, new.glibc, new.python) == ("Amazon Linux 2023", 34, "3.11")  # the servers' Python
    refused = refusals(old, WHEELS)
    assert [r.split(":")[0] for r in refused] == ["torch==2.13.0", "numpy==2.4.6"], refused
    assert "glibc 2.26" in refused[0] and "manylinux_2_28_x86_64" in refused[0]
    assert refusals(new, WHEELS) == []
    assert refusals(Image(new.base, new.system, 34, "3.12", ()), {"x==1": ["x-1-cp311-cp311-manylinux_2_17_x86_64.whl"]})


def test_a_base_image_of_unknown_platform_is_refused_not_guessed():
    with pytest.raises(ConfigError, match="not one whose glibc is known"):
        read(AL2_DOCKERFILE.replace("python:3.11", "python:3.99"))
    with pytest.raises(ConfigError, match="has no Python of its own"):
        read("FROM public.ecr.aws/lambda/provided:al2023\nRUN pip install x==1\n")


def test_the_dockerfile_installs_the_pins_the_image_test_installs():
    image = read(DOCKERFILE.read_text())
    pins = [p for i in image.installs for p in i.pins]
    assert {p.split("==")[0] for p in pins} >= {"torch", "numpy", "pyzmq", "cryptography", "boto3", "awslambdaric"}
    assert [i.index_url for i in image.installs if "torch==2.13.0" in i.pins] == ["https://download.pytorch.org/whl/cpu"]
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["/usr/bin/python3.11", "-m", "awslambdaric"]' in text  # an OS-only image runs the client
    assert re.search(r"^WORKDIR \$\{LAMBDA_TASK_ROOT\}$", text, re.M)  # where the handler's package is imported from


def _at_hand(pin: str) -> list[str]:
    """Wheel files of ``pin`` on this machine, offline: pip's find-links folders, and the tags of the
    installed distribution of that version (its WHEEL file)."""
    name, version = pin.split("==")
    files = []
    for folder in filter(None, re.split(r"[\s]+", os.environ.get("PIP_FIND_LINKS", ""))):
        files += [p.name for p in Path(folder).glob("*.whl")
                  if re.fullmatch(rf"{re.escape(name)}-{re.escape(version)}(\+\w+)?", "-".join(p.name.split("-")[:2]),
                                  re.I)]
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return files
    if dist.version.split("+")[0] == version:
        tags = re.findall(r"^Tag: (\S+)$", dist.read_text("WHEEL") or "", re.M)
        files += [f"{name.replace('-', '_')}-{dist.version}-{t}.whl" for t in tags]
    return files


def check(dockerfile: str) -> tuple[list[str], list[str]]:
    """(refusals, how each install was checked) for a Dockerfile's text: pip's resolver for the image's
    platform; where it finds nothing, the same resolver for a newer glibc tells an unreachable index
    (nothing either: check the wheels at hand) from a package with no wheel for the image."""
    image = read(dockerfile)
    refused, how = [], []
    for install in image.installs:
        files, error = resolve(image, install)
        if not error:
            how.append(f"resolved {len(files)} wheels for {' '.join(install.pins)}")
            refused += refusals(image, {f: [f] for f in files})  # the resolver's choice, checked by the rule
            continue
        if not resolve(image, install, glibc=40)[1]:
            refused.append(f"{refused_pin(install, error)}: pip finds no wheel for {image.describe()}")
            continue
        at_hand = {p: _at_hand(p) for p in install.pins}
        how.append(f"offline, wheels at hand for {sorted(p for p, f in at_hand.items() if f)}")
        refused += refusals(image, at_hand)
    return refused, how


@pytest.mark.timeout(900)
@pytest.mark.long
def test_the_images_pins_install_on_its_platform():
    refused, how = check(DOCKERFILE.read_text())
    assert refused == [], refused
    print("; ".join(how))


@pytest.mark.timeout(900)
@pytest.mark.long
def test_the_check_refuses_the_python_3_11_image_naming_torch():
    """The same check, on the Dockerfile before issue 43 (its torch install is the first pip install)."""
    refused, _ = check(AL2_DOCKERFILE)
    assert refused and refused[0].startswith("torch==2.13.0"), refused


def test_the_image_is_built_as_lambda_accepts_it():
    """Lambda refuses an OCI image index, which BuildKit pushes when it adds provenance or SBOM attestations."""
    docs = (DOCKERFILE.parents[1] / "docs" / "aws.md").read_text()
    builds = [line for line in docs.splitlines() if line.startswith("docker build")]
    assert builds and all("--platform linux/amd64" in b and "--provenance=false" in b and "--sbom=false" in b
                          for b in builds), builds

