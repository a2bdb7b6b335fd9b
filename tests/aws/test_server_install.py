"""What a server runs, from its boot script (infra/templates/server.sh.tftpl): this project's wheel from
the bucket and locked dependencies, every file's hash checked; the Lambda image's torch; its own user,
sandboxed, started again after every exit."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("hcl2")
from packaging.requirements import Requirement  # noqa: E402

from dorylus_py.rehearsal.image_platform import read  # noqa: E402
from dorylus_py.rehearsal.servers import Unit, heredoc  # noqa: E402
from tests.aws.terraform import INFRA, blocks, user_data  # noqa: E402

REPO = INFRA.parent
SERVER = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _lock() -> dict[str, tuple[str, list[str]]]:
    out = {}
    for line in (INFRA / "server-requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            pin, *hashes = line.split()
            name, _, version = pin.partition("==")
            out[name] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return out


def _dockerfile_pins() -> dict[str, str]:
    installs = read((REPO / "lambda_functions" / "Dockerfile").read_text()).installs
    return dict(p.lower().split("==") for i in installs for p in i.pins)


def test_servers_install_this_projects_wheel_from_the_bucket_with_every_hash_checked():
    script = user_data(wheel_sha256="ab" * 32)
    assert "dorylus-py[" not in script and "dorylus-py==" not in script  # nothing by name from an index
    assert "aws s3 cp --only-show-errors --region us-east-1 's3://dorylus-data-x/packages/dorylus_py-0.1.0-py3-none-any.whl' " \
           "'/opt/dorylus/wheels/dorylus_py-0.1.0-py3-none-any.whl'" in script
    requirements = heredoc(script, "/opt/dorylus/requirements.txt").splitlines()
    assert requirements[-1] == f"/opt/dorylus/wheels/dorylus_py-0.1.0-py3-none-any.whl --hash=sha256:{'ab' * 32}"
    assert all(re.fullmatch(r"\S+ --hash=sha256:[0-9a-f]{64}", r) for r in requirements if not r.startswith("#"))
    pip = [line for line in script.splitlines() if "/opt/dorylus/bin/pip install" in line]
    assert len(pip) == 1 and "--require-hashes" in pip[0] and "-r /opt/dorylus/requirements.txt" in script
    # Terraform hands the template the uploaded object's key and the file's own hash
    args = blocks("resource")[("aws_instance", "server")]["user_data"]
    assert "wheel_sha256 = local.wheel_sha256" in args and "aws_s3_object.server_wheel.key" in args
    assert 'wheel_sha256 = var.server_wheel == "" ? "" : filesha256(var.server_wheel)' in \
        (INFRA / "ec2.tf").read_text()  # the file's own hash (none read at destroy, which needs no wheel)
    wheel = blocks("resource")[("aws_s3_object", "server_wheel")]
    assert wheel["source"] == "${var.server_wheel}" and wheel["kms_key_id"] == "${aws_kms_key.data.arn}"
    assert wheel["source_hash"] == "${local.wheel_sha256}"


def test_servers_get_the_lambda_images_torch_and_pins():
    lock, image = _lock(), _dockerfile_pins()
    assert lock["torch"][0] == image["torch"] + "+cpu"  # the image installs from the CPU index
    assert "download.pytorch.org/whl/cpu" in (REPO / "lambda_functions" / "Dockerfile").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in user_data()
    for name in set(image) & set(lock) - {"torch"}:
        assert lock[name][0] == image[name], f"{name}: servers {lock[name][0]}, Lambda image {image[name]}"


def test_the_install_constraints_pin_the_lock():
    """The README's and CI's install (-c constraints.txt) gets every locked package at the lock's version
    (torch as the CPU build's version), so the check below compares the lock against the same versions
    on every fresh machine, not against whatever a dependency released that day."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    wrong = {n: (pins.get(n.lower().replace("_", "-")), v) for n, (v, _) in _lock().items()
             if pins.get(n.lower().replace("_", "-")) != v.removesuffix("+cpu")}
    assert wrong == {}, f"constraints.txt vs infra/server-requirements.txt: {wrong}"


def test_the_lock_covers_every_dependency_of_the_wheel():
    """pip --require-hashes refuses a dependency missing from the lock: the boot would stop. The
    closure of pyproject's dependencies (and the aws extra), from the installed packages' metadata for
    the servers' platform, must be exactly the lock, at constraints.txt's versions (what the README
    installs here; an install without constraints may hold newer ones, which says nothing of the lock)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["aws"]]
    need: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in need:
            continue
        need[name] = metadata.version(req.name)
        for extra in [""] + sorted(req.extras):
            for sub in metadata.requires(req.name) or []:
                sub = Requirement(sub)
                if sub.marker is None or sub.marker.evaluate(SERVER | {"extra": extra}):
                    todo.append(sub)
    lock = {n.replace("_", "-"): v for n, (v, _) in _lock().items()}
    assert set(need) == set(lock), f"missing from the lock: {sorted(set(need) - set(lock))}; not needed: " \
                                   f"{sorted(set(lock) - set(need))} (python infra/lock_server_requirements.py)"
    pinned = {n.lower().replace("_", "-"): v for n, _, v in (line.partition("==") for line in
              (REPO / "constraints.txt").read_text().splitlines() if "==" in line and not line.startswith("#"))}
    assert {n: v for n, v in lock.items() if pinned.get(n) != v.split("+")[0]} == {}  # torch: 2.13.0+cpu


def test_servers_run_as_their_own_user_sandboxed_and_come_back_after_every_exit():
    script = user_data("weight-server", 0)
    unit = Unit.parse(heredoc(script, "/etc/systemd/system/dorylus.service"))
    assert unit.exec_start == ["/opt/dorylus/bin/dorylus", "weight-server", "--cluster", "/etc/dorylus/cluster.json",
                               "--rank", "0"]
    assert unit.one("User") == "dorylus" and re.search(
        r"^id -u dorylus > /dev/null 2>&1 \|\| useradd --system .*--home-dir /var/lib/dorylus .*dorylus$", script, re.M)
    assert {k: unit.one(k) for k in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp")} == {
        "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes"}
    writes = [unit.environment["HOME"], unit.environment["DORYLUS_CACHE"], unit.one("WorkingDirectory")]
    for path in writes:  # everything the server writes is under a writable path; its code is not
        assert any(Path(path).is_relative_to(w) for w in unit.writable), path
    assert not any(Path("/opt/dorylus").is_relative_to(w) or Path(w).is_relative_to("/opt/dorylus") for w in unit.writable)
    assert all(unit.restarts_after(code) for code in (0, 2, 3, 130))  # a finished job, a missing key, a crash
    assert unit.one("Restart") == "always"


def test_reserved_concurrency_is_unset_unless_asked():
    """Reserving concurrency needs a quota of N + 100, which new accounts lack: apply would fail there."""
    var = blocks("variable")[("lambda_reserved_concurrency",)]
    assert var["default"] is None and "quota" in var["description"]
    assert blocks("resource")[("aws_lambda_function", "tensor")]["reserved_concurrent_executions"] == \
        "${var.lambda_reserved_concurrency}"


def _gpu_branch(script: str, opt: Path) -> str:
    """The boot script's lines from the choice of Python to the end of the GPU image's block, /opt/dorylus moved."""
    lines = heredoc(script, "/usr/local/sbin/dorylus-install").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("python="))
    end = next(i for i, line in enumerate(lines) if line == "fi" and i > start)
    return "set -euo pipefail\n" + "\n".join(lines[start:end + 1]).replace("/opt/dorylus", str(opt)) + "\necho \"$deps\"\n"


def _image(tmp_path: Path, cuda: str | None) -> Path:
    """A stand-in for a GPU image's Python: this interpreter, with a folder holding a ``torch`` built for ``cuda``."""
    import sys

    site = tmp_path / "image-site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(f"class version:\n    cuda = {cuda!r}\n")
    python = tmp_path / "image-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("cuda", ["12.4", None])
@pytest.mark.long
def test_a_gpu_image_keeps_its_cuda_torch(tmp_path, cuda):
    """graph_server_ami: the lock's CPU torch is left out and pip installs the lock as it is (--no-deps); the
    environment imports the image's torch, after its own packages; an image without a CUDA torch stops the boot."""


    lock = "\n".join(line for line in (INFRA / "server-requirements.txt").read_text().strip().splitlines()
                     if not line.startswith("torch=="))
    python = _image(tmp_path, cuda)
    script = user_data(python=str(python), image_torch="true", requirements=lock)
    assert not [r for r in heredoc(script, "/opt/dorylus/requirements.txt").splitlines() if r.startswith("torch")]
    assert "$deps" in next(line for line in script.splitlines() if "/opt/dorylus/bin/pip install" in line)
    proc = subprocess.run(["bash", "-c", _gpu_branch(script, tmp_path / "venv")], capture_output=True, text=True,
                          timeout=300, check=False)
    if cuda is None:
        assert proc.returncode != 0 and "not Python 3.11 with a CUDA build of torch" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "--no-deps"
    probe = "import sys, sysconfig, torch; print(torch.version.cuda, torch.__file__, sys.path.index(sysconfig.get_path('purelib')) < sys.path.index(str(__import__('pathlib').Path(torch.__file__).parents[1])))"
    out = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split()
    assert out == ["12.4", str(tmp_path / "image-site" / "torch" / "__init__.py"), "True"]


def test_the_cpu_image_installs_the_locks_torch_with_the_resolver():
    script = user_data()
    assert "torch==2.13.0+cpu" in heredoc(script, "/opt/dorylus/requirements.txt")
    proc_lines = _gpu_branch(script, Path("/x")).splitlines()
    assert "python='python3.11'" in proc_lines and "if [ 'false' = true ]; then" in proc_lines


def _install_sandbox(tmp_path: Path, aws_failures: int, pip_failures: int = 0) -> subprocess.CompletedProcess:
    """The boot script's install script, /opt/dorylus moved under ``tmp_path``, run with stand-ins on PATH
    for what a fresh instance has (dnf, id, useradd, sleep, a Python that makes a venv whose pip is a
    stand-in too) and an ``aws`` that fails ``aws_failures`` times before it copies the wheel, as a
    download does before the instance role's credentials arrive. Every stand-in logs its arguments."""
    opt, bin_, log = tmp_path / "opt", tmp_path / "bin", tmp_path / "calls.log"
    bin_.mkdir()

    def tool(name: str, body: str) -> None:
        (bin_ / name).write_text(f"#!/bin/bash\necho \"{name} $*\" >> {log}\n{body}\n")
        (bin_ / name).chmod(0o755)

    def failing(name: str, times: int, then: str) -> str:
        count = tmp_path / f"{name}.count"
        return (f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
                f"if [ $n -le {times} ]; then echo '{name}: failed' >&2; exit 1; fi\n{then}")

    for name in ("dnf", "useradd", "sleep"):
        tool(name, "exit 0")
    tool("id", "exit 1")  # no user dorylus yet
    tool("aws", failing("aws", aws_failures, 'echo wheel > "${@: -1}"'))
    tool("pip", failing("pip", pip_failures, "exit 0"))
    tool("python3.11", f'[ "$1 $2" = "-m venv" ] && mkdir -p "$3/bin" && ln -sf {bin_}/pip "$3/bin/pip"')
    script = heredoc(user_data(), "/usr/local/sbin/dorylus-install").replace("/opt/dorylus", str(opt))
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": f"{bin_}:/usr/bin:/bin"})


def _calls(tmp_path: Path, name: str) -> list[str]:
    return [line for line in (tmp_path / "calls.log").read_text().splitlines() if line.split()[0] == name]


def test_the_install_survives_a_failing_first_download(tmp_path):
    proc = _install_sandbox(tmp_path, aws_failures=2, pip_failures=1)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "opt" / ".installed").exists() and (tmp_path / "opt" / "wheels").is_dir()
    assert len(_calls(tmp_path, "aws")) == 3 and len(_calls(tmp_path, "pip")) == 2
    assert [c.split()[1] for c in _calls(tmp_path, "sleep")] == ["5", "10", "5"]  # each command's own back-off
    assert "attempt 1 of aws failed" in proc.stderr and _calls(tmp_path, "useradd")


def test_an_install_that_keeps_failing_exits_for_its_unit_to_start_it_again(tmp_path):
    proc = _install_sandbox(tmp_path, aws_failures=99)
    assert proc.returncode != 0 and not (tmp_path / "opt" / ".installed").exists()
    assert len(_calls(tmp_path, "aws")) == 7 and not _calls(tmp_path, "pip")
    assert [c.split()[1] for c in _calls(tmp_path, "sleep")] == ["5", "10", "20", "40", "60", "60"]
    script = user_data()
    install = Unit.parse(heredoc(script, "/etc/systemd/system/dorylus-install.service"))
    assert install.exec_start == ["/usr/local/sbin/dorylus-install"] and install.one("Type") == "oneshot"
    assert install.restarts_after(1) and install.one("StartLimitIntervalSec") == "0"  # again, without end
    assert install.one("ConditionPathExists") == "!/opt/dorylus/.installed"  # done once, not at every boot
    assert install.one("ExecStartPost") == "/usr/bin/systemctl start --no-block dorylus.service"
    server = Unit.parse(heredoc(script, "/etc/systemd/system/dorylus.service"))
    assert server.one("ConditionPathExists") == "/opt/dorylus/.installed"
    assert "dorylus-install.service" in server.one("After").split()
    assert script.rstrip().splitlines()[-2:] == [
        "systemctl enable dorylus-install.service dorylus.service # at a reboot: the server (the install is done)",
        "systemctl start --no-block dorylus-install.service # which starts the server when it has succeeded"]
