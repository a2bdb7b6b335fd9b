"""``dorylus aws rehearse``: docs/aws.md's steps, in its order, against AWS on loopback.

A moto server enforces IAM (``moto_aws.py``). The operator's identity has the policy docs/aws.md tells
users to attach (``infra/operator-policy.json``); Terraform applies infra/ unchanged with only the
endpoint override (``terraform.py``), in ``src``, a copy of the checkout. Sections 1 and 5 run as the
guide writes them (``guide.py``): ``build-context`` into a folder whose parent is not there yet,
the bucket's ``force_destroy`` and ``destroy`` without the wheel. The servers start as their user data
says (``servers.py``): the wheel fetched from the bucket through the instance role, checked against its
hash and installed, the unit's ExecStart with the role's STS credentials, on the cluster file's
addresses moved to loopback. The driver runs as the docs say, its Lambdas through the Invoke API to
containers run as the image runs them (AWS's runtime client over the Lambda Runtime API, seeing the
build context: ``lambda_runtime.py``). Two jobs on the same servers must give the per-epoch losses of
``--backend local``, then section 5 must leave nothing. The image's own packages are proven in
tests/aws/test_lambda_image.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dorylus_py import children
from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.rehearsal import audit, guide
from dorylus_py.rehearsal.guide import JOBS, NOT_REHEARSED, PROMISED, STEPS
from dorylus_py.rehearsal.lambda_runtime import LambdaService
from dorylus_py.rehearsal.moto_aws import ACCOUNT, MotoAws
from dorylus_py.rehearsal.servers import (
    Host,
    Supervisor,
    heredoc,
    loopback_cluster,
    wait_until,
)
from dorylus_py.rehearsal.terraform import INFRA, Terraform, find_aws_cli, find_tools

REPO = INFRA.parent
REGION = "us-east-1"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dorylus-lambda:v1"
SOURCES = ("pyproject.toml", "README.md", "dorylus_py", "graph_servers", "lambda_functions")  # what a wheel needs
# The docs' training flags, changed for a short run whose losses equal --backend local's exactly.
TRAINING = ["--lambdas", "2", "--mode", "sync", "--epochs", "{epochs}", "--chunks", "2", "--fuse", "on",
            "--dropout", "0", "--quiet", "--checkpoint-every", "1"]  # a second save reads the first's latest.json


class Rehearsal:
    # docs/aws.md's `terraform apply -var`s, with what stands in for the values it computes
    VARIABLES = {"region": REGION, "lambda_image_uri": IMAGE, "operator_cidr": "192.0.2.1/32", "server_wheel": "(the wheel)",
                 "graph_server_count": "2", "graph_server_type": "c5n.2xlarge", "weight_server_count": "1"}

    def __init__(self, work: Path, plugin_dir: str = "", epochs: int = 3, say=print):
        self.work, self.epochs, self.say = work, epochs, say
        self.src = work / "src"  # the checkout, as a fresh clone has it
        self.terraform_bin, self.mirror = find_tools(plugin_dir)
        find_aws_cli()
        for module, what in (("moto.server", "moto's server"), ("awslambdaric", "AWS's Lambda runtime client")):
            try:
                __import__(module)
            except ImportError:
                raise ConfigError(f"the rehearsal needs {what}: pip install -c constraints.txt -e '.[dev]'") from None
        self.lambdas: LambdaService | None = None
        self.aws = MotoAws(tls_dir=work / "tls")
        self.steps: list[tuple[str, float]] = []  # (what docs/aws.md says, seconds)
        self.supervisors: list[Supervisor] = []
        self.hosts: list[Host] = []
        self.variables: dict[str, str] = {}
        self.t0 = time.monotonic()

    # --- the run ---------------------------------------------------------------------------------

    def run(self) -> dict:
        self.work.mkdir(parents=True, exist_ok=True)
        self.aws.start()
        reference = None
        try:
            self.harness, self.operator = self._identities()
            self.aws.enforce(True)
            self._copy_checkout()
            self._guide_section("## 1. The Lambda image")
            wheel = self._build_wheel()
            before = audit.inventory(self.client)
            with ThreadPoolExecutor(1) as terraform:  # Terraform mostly waits on AWS: make the data meanwhile
                provisioned = terraform.submit(self._provision, wheel)
                graph = self._synth()
                reference = self._start_reference(graph)  # the same job on --backend local
                tf, outputs = provisioned.result()
            policies = audit.role_policies(self.client)
            operator = audit.operator_policy(self.client, json.loads((INFRA / "operator-policy.json").read_text()),
                                             self.operator_arn)
            losses = self._operate(outputs, graph)
            local = self._step("(rehearsal) the same configuration on --backend local", lambda: _losses(reference))
            for job, got in enumerate(losses, 1):
                if got != local:
                    raise DorylusError(f"job {job}'s losses {got} differ from --backend local's {local}")
            (self.src / "dist").rename(self.work / "dist")  # destroy needs no wheel
            self._guide_section("## 5. Back to nothing", tf.env | self.operator)
            left = audit.leftovers(before, audit.inventory(self.client))
            if left:
                raise DorylusError(f"docs/aws.md's section 5 left {', '.join(left)}")
            findings = audit.check(self.aws.calls, policies, operator, bucket=outputs["bucket"]["value"])
            ran = tuple(docs for docs, _ in self.steps if not docs.startswith("("))
            if findings.problems or ran != STEPS:
                raise DorylusError("; ".join(findings.problems) or f"ran {ran}, not docs/aws.md's {STEPS}")
            return {"seconds": round(time.monotonic() - self.t0, 1), "steps": self.steps, "losses": local,
                    "jobs": len(losses), "job_losses": losses, "calls": len(self.aws.calls), "used": findings.used,
                    "exits": {h.name: h.exits for h in self.hosts}}
        finally:
            audit.write_calls(self.aws.calls, self.work / "calls.jsonl")
            self._stop_servers()
            if self.lambdas is not None:
                self.lambdas.stop()
            if reference is not None and reference[0].poll() is None:
                reference[0].kill()
                reference[0].wait(10)
            self.aws.stop()

    def _provision(self, wheel: Path) -> tuple[Terraform, dict]:
        tf = Terraform(self.terraform_bin, self.src, self.aws.url, (self.operator["AWS_ACCESS_KEY_ID"],
                       self.operator["AWS_SECRET_ACCESS_KEY"]), self.aws.ca_bundle, self.work / "terraform.log")
        self.variables = self.VARIABLES | {"server_wheel": str(wheel)}
        self._step("terraform init", lambda: tf.init(self.mirror))
        self._step("terraform apply", lambda: tf.apply(self.variables))
        outputs = self._step("terraform output -json > tf.json", tf.output)
        (self.work / "tf.json").write_text(json.dumps(outputs))
        self._as_operator("dorylus aws cluster-file", "aws", "cluster-file", "--terraform-output",
                          self.work / "tf.json", "--out", self.work / "cluster.json")
        return tf, outputs

    def _operate(self, outputs: dict, graph: Path) -> list[list[float]]:
        """The servers boot as soon as Terraform made them and wait for the job key; then the operator's
        steps, the function's configuration, and the jobs on graph server 0."""
        self.hosts = self._step("(rehearsal) the servers boot, before the job key is stored", lambda: self._boot(outputs))
        wait_until(lambda: all(h.exits for h in self.hosts), 120, "each server's first start, which finds no job key")
        self._as_operator("dorylus aws put-secret", "aws", "put-secret", "--region", REGION, "--secret-id",
                          outputs["job_key_secret"]["value"])
        dataset = f"{outputs['dataset_uri']['value']}/mygraph"
        self._as_operator("dorylus prepare", "prepare", graph, "--partitions", "2", "--out", dataset)
        function = self._check_function(outputs)
        self.lambdas = self._lambda_service(function)
        url = self.lambdas.start()
        losses = [self._train(self.hosts, outputs["bucket"]["value"], f"aws{j + 1}", function, url) for j in range(JOBS)]
        self._stop_servers()
        return losses

    def _guide_section(self, heading: str, env: dict | None = None) -> None:
        """The section's commands as docs/aws.md writes them, each in bash in the checkout, as the operator
        (those of NOT_REHEARSED left out)."""
        env = (env or self._operator_env()) | {"PATH": f"{sysconfig.get_paths()['scripts']}{os.pathsep}"
                                                       f"{(env or os.environ).get('PATH', '')}"}
        before, own = guide.section(heading)
        for i, command in enumerate(own):
            if command.startswith(tuple(NOT_REHEARSED)):
                continue
            step = next((s for s in STEPS if command.startswith(s)), command)
            out = self._step(step, lambda c=command, i=i: guide.run(c, before + own[:i], self.src, env,
                                                                    self.work / "guide.log"))
            if PROMISED.get(step, "") not in out:
                raise DorylusError(f"docs/aws.md's `{step}` did not print {PROMISED[step]!r}; see {self.work / 'guide.log'}")

    def _step(self, docs: str, action):
        start = time.monotonic()
        result = action()
        self.steps.append((docs, round(time.monotonic() - start, 1)))
        self.say(f"[{time.monotonic() - self.t0:6.1f} s] {docs} ({time.monotonic() - start:.1f} s)")
        return result

    # --- identities --------------------------------------------------------------------------------

    def _identities(self) -> tuple[dict, dict]:
        """The harness (reads what it checks; allowed everything, left out of the audit) and the operator,
        with infra/operator-policy.json: what docs/aws.md tells users to attach."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.aws.url, region_name=REGION, aws_access_key_id="testing",
                           aws_secret_access_key="testing", verify=self.aws.ca_bundle)
        envs = []
        for user, policy in (("rehearsal-harness", {"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
                             ("operator", json.loads((INFRA / "operator-policy.json").read_text()))):
            iam.create_user(UserName=user)
            if user == "operator":  # a managed policy, as docs/aws.md attaches it (a user's inline ones hold 2,048)
                arn = iam.create_policy(PolicyName="dorylus-operator", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
                iam.attach_user_policy(UserName=user, PolicyArn=arn)
            else:
                iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            envs.append(self._env(key["AccessKeyId"], key["SecretAccessKey"]) | {"AWS_DEFAULT_REGION": REGION})
        self.operator_arn = f"arn:aws:iam::{ACCOUNT}:user/operator"
        return envs[0], envs[1]

    def _env(self, key_id: str, secret: str, token: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DORYLUS_"))}
        env |= {"AWS_ENDPOINT_URL": self.aws.url, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_CA_BUNDLE": self.aws.ca_bundle, "AWS_EC2_METADATA_DISABLED": "true"}
        return env | ({"AWS_SESSION_TOKEN": token} if token else {})

    def client(self, service: str, env: dict | None = None, region: str = REGION):
        """A boto3 client of the harness (or of the identity whose environment ``env`` is)."""
        import boto3

        env = env or self.harness
        return boto3.client(service, endpoint_url=self.aws.url, region_name=region, verify=self.aws.ca_bundle,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                            aws_session_token=env.get("AWS_SESSION_TOKEN"))

    # --- the operator's steps ----------------------------------------------------------------------

    def _copy_checkout(self) -> None:
        """``src``: the sources a checkout has (infra/ goes there with Terraform), no ``build/`` nor ``dist/``."""
        self.src.mkdir()
        for name in SOURCES:
            if (REPO / name).is_dir():
                shutil.copytree(REPO / name, self.src / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(REPO / name, self.src / name)

    def _build_wheel(self) -> Path:
        """``pip wheel --no-deps -w dist .`` in the checkout."""
        self._step("pip wheel --no-deps -w dist .", lambda: _run(
            children.module("pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", "dist", "."),
            self.src, os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}, self.work / "pip.log"))
        return next((self.src / "dist").glob("dorylus_py-*.whl"))

    def _synth(self) -> Path:
        graph = self.work / "graph.npz"
        _run(children.module("dorylus_py", "synth", "--out", graph, "--nodes", "600", "--edges", "6000", "--features",
                             "16", "--classes", "4", "--seed", "3"), self.work, self._operator_env(), self.work / "synth.log")
        return graph

    def _operator_env(self) -> dict[str, str]:
        return self.operator | {"PYTHONPATH": str(REPO), "DORYLUS_CACHE": str(self.work / "operator-cache")}

    def _as_operator(self, docs: str, *args) -> None:
        self._step(docs, lambda: _run(children.module("dorylus_py", *args), self.work, self._operator_env(),
                                      self.work / "operator.log"))

    def _start_reference(self, graph: Path):
        """The same job on ``--backend local``, from the same prepared partitions, run while Terraform works."""
        env = {k: v for k, v in self._operator_env().items() if not k.startswith("AWS_")}
        store = self.work / "local-store"
        _run(children.module("dorylus_py", "prepare", graph, "--partitions", "2", "--out", store), self.work, env,
             self.work / "local.log")
        args = [a.format(epochs=self.epochs) for a in TRAINING]
        out = self.work / "local-run"
        with open(self.work / "local.log", "ab") as log:  # the child keeps its own copy of the file
            proc = subprocess.Popen(children.module("dorylus_py", "train", "--backend", "local", "--data", store, *args,
                                                    "--out", out), cwd=self.work, env=children.env(env), stdout=log, stderr=log)
        return proc, out

    def _check_function(self, outputs: dict) -> dict:
        """The function as Terraform made it: the image, the job key's secret named (not held) in its
        environment, its role, its memory, and no reserved concurrency unless asked."""
        lam = self.client("lambda")
        name = outputs["lambda_function"]["value"]
        config = lam.get_function_configuration(FunctionName=name)
        want = {"DORYLUS_KEY_SECRET": outputs["job_key_secret"]["value"]}
        if config["Environment"]["Variables"] != want or not config["Role"].endswith(":role/dorylus-lambda"):
            raise DorylusError(f"function {name}: environment {config['Environment']}, role {config['Role']}")
        if "ReservedConcurrentExecutions" in lam.get_function_concurrency(FunctionName=name):
            raise DorylusError(f"function {name}: reserved concurrency set though lambda_reserved_concurrency is null")
        self._step("(rehearsal) the Lambda function as Terraform made it", lambda: None)
        return config

    def _lambda_service(self, function: dict) -> LambdaService:
        """The function's Invoke API, answered by containers run as its image runs them: AWS's runtime client
        in the build context section 1 wrote (then this environment's packages, for the image's), with the
        function's environment and its role's credentials (STS AssumeRole, as Lambda itself: unchecked)."""
        self.aws.enforce(False)
        try:
            creds = self.client("sts").assume_role(RoleArn=function["Role"], RoleSessionName="container")["Credentials"]
        finally:
            self.aws.enforce(True)
        env = self._env(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])
        env |= {"AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}
        paths = [str(self.src / "build" / "lambda"), sysconfig.get_paths()["purelib"]]
        return LambdaService(self.aws.url, function, paths, env, self.aws.ca_bundle, self.work / "lambda.log")

    # --- the servers -------------------------------------------------------------------------------

    def _boot(self, outputs: dict) -> list[Host]:
        """Each instance's user data, run as far as this machine can: the wheel through the role, checked
        and installed; the files it writes; its unit under a supervisor, with the role's credentials."""
        ec2 = self.client("ec2")
        net = random.Random().randrange(2, 250)  # 127.net.0.x: two rehearsals at once do not collide
        hosts = []
        for reservation in ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])["Reservations"]:
            for instance in reservation["Instances"]:
                name = next(t["Value"] for t in instance["Tags"] if t["Key"] == "Name").removeprefix("dorylus-")
                data = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
                user_data = base64.b64decode(data["UserData"]["Value"]).decode()
                hosts.append(Host(name, self.work / "hosts" / name, user_data, net))
        if sorted(h.name for h in hosts) != ["graph-server-0", "graph-server-1", "weight-server-0"]:
            raise DorylusError(f"instances: {[h.name for h in hosts]}")
        listed = {name: server["id"] for name, server in outputs["servers"]["value"].items()}
        running = {f"dorylus-{h.name}" for h in hosts}
        if {f"dorylus-{n}" for n in listed} != running:  # what docs/aws.md restarts every server with
            raise DorylusError(f"output servers names {sorted(listed)}, not every instance")
        role = self._instance_role()
        install = self._install_wheel(hosts[0].user_data, outputs["bucket"]["value"], role)
        for host in sorted(hosts, key=lambda h: h.name):
            unit = host.boot()
            host.path("/opt").mkdir(parents=True, exist_ok=True)
            host.path("/opt/dorylus").symlink_to(install)  # the venv pip made, shared by the hosts here
            env = host.environment(unit, os.environ, role | {"PYTHONPATH": str(install)})
            self.supervisors.append(Supervisor(host, unit, host.command(unit), env, self.work / f"{host.name}.log").start())
        return sorted(hosts, key=lambda h: h.name)

    def _instance_role(self) -> dict[str, str]:
        """The credentials EC2 hands an instance of the profile (STS AssumeRole, as EC2 itself: unchecked)."""
        iam, sts = self.client("iam"), self.client("sts")
        role = iam.get_instance_profile(InstanceProfileName="dorylus-server")["InstanceProfile"]["Roles"][0]["Arn"]
        self.aws.enforce(False)
        try:
            creds = sts.assume_role(RoleArn=role, RoleSessionName="i-rehearsal")["Credentials"]
        finally:
            self.aws.enforce(True)
        return self._env(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])

    def _install_wheel(self, user_data: str, bucket: str, role: dict[str, str]) -> Path:
        """The boot script's ``aws s3 cp`` (through the role) and ``pip install --require-hashes`` of the
        wheel line of its requirements (the locked dependencies are this environment's)."""
        line = heredoc(user_data, "/opt/dorylus/requirements.txt").splitlines()[-1]
        path, want = line.split(" --hash=sha256:")
        key = next(w for w in user_data.split() if w.startswith(f"'s3://{bucket}/")).strip("'").split("/", 3)[3]
        wheels = self.work / "opt" / "dorylus-wheels"
        wheels.mkdir(parents=True)
        s3 = self.client("s3", role)
        local = wheels / Path(path).name
        s3.download_file(bucket, key, str(local))
        if hashlib.sha256(local.read_bytes()).hexdigest() != want:
            raise DorylusError(f"s3://{bucket}/{key}: not the wheel whose hash the user data holds")
        (wheels / "requirements.txt").write_text(f"{local} --hash=sha256:{want}\n")
        install = self.work / "opt" / "dorylus"
        _run(children.module("pip", "install", "--quiet", "--no-deps", "--require-hashes", "--target", install,
                             "-r", wheels / "requirements.txt"), self.work, os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
             self.work / "pip.log")
        return install

    def _stop_servers(self) -> None:
        for s in self.supervisors:
            s.stop()
        self.supervisors = []

    # --- the jobs ----------------------------------------------------------------------------------

    def _train(self, hosts: list[Host], bucket: str, name: str, function: dict, lambda_url: str) -> list[float]:
        """docs/aws.md's train command (as its ``systemd-run`` unit runs it) and report on graph server 0,
        as ec2-user with the instance role and ``$BUCKET`` from the login profile the boot script wrote."""
        driver = hosts[0]
        profile = driver.path("/etc/profile.d/dorylus.sh").read_text()
        found = re.search(r"^export BUCKET=(\S+)$", profile, re.M)
        if found is None or found.group(1) != bucket:
            raise DorylusError(f"graph server 0's login profile sets no BUCKET={bucket}: {profile[:200]!r}")
        home = driver.path("/home/ec2-user")
        home.mkdir(parents=True, exist_ok=True)
        cluster = json.loads((self.work / "cluster.json").read_text())
        (home / "cluster.json").write_text(json.dumps(loopback_cluster(cluster, driver.net)))  # scp'd there
        wait_until(lambda: all(s.running for s in self.supervisors), 60,
                   f"every server running for {name} (its unit starts it again after a job)")
        env = self.supervisors[0].env | {"HOME": str(home)}
        env = {k: v for k, v in env.items() if k not in ("AWS_DEFAULT_REGION", "DORYLUS_CACHE")}  # an ssh session's
        dorylus = str(driver.path("/opt/dorylus/bin/dorylus"))
        args = [a.format(epochs=self.epochs) for a in TRAINING]
        self._step("sudo systemd-run", lambda: _run(
            [dorylus, "train", "--backend", "lambda", "--cluster", "cluster.json", "--data",
             f"s3://{found.group(1)}/datasets/mygraph", *args, "--out", f"runs/{name}", "--checkpoint-dir",
             f"s3://{found.group(1)}/checkpoints/{name}", "--lambda-endpoint", lambda_url], home, env,
            self.work / f"{name}.log"))
        record = json.loads((home / "runs" / name / "config.json").read_text())
        if record["lambda_memory_mb"] != function["MemorySize"]:
            raise DorylusError(f"{name}: recorded {record['lambda_memory_mb']} MB, deployed {function['MemorySize']}")
        found = {o["Key"] for o in self.client("s3").list_objects_v2(Bucket=bucket, Prefix=f"checkpoints/{name}/")
                 .get("Contents", [])}
        if f"checkpoints/{name}/latest.json" not in found:
            raise DorylusError(f"{name}: no checkpoint in s3://{bucket}/checkpoints/{name}/ ({sorted(found)})")
        self._step("/opt/dorylus/bin/dorylus report", lambda: _run(
            [dorylus, "report", f"runs/{name}", "--as-instance", "c5n.2xlarge"], home, env, self.work / f"{name}.log"))
        return _losses((None, home / "runs" / name))


def _losses(run) -> list[float]:
    proc, out = run
    if proc is not None and proc.wait(timeout=600) != 0:
        raise DorylusError(f"the --backend local run failed (exit {proc.returncode}); see {out.parent / 'local.log'}")
    return [json.loads(line)["loss"] for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def _run(argv: list, cwd: Path, env: dict, log: Path, timeout_s: float = 600) -> None:
    what = f"{Path(str(argv[0])).name} {' '.join(map(str, argv[1:3]))}"
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(map(str, argv))}\n".encode())
        out.flush()
        try:
            code = subprocess.run([str(a) for a in argv], cwd=cwd, env=children.env(env), stdout=out, stderr=out, timeout=timeout_s,
                                  check=False).returncode
        except subprocess.TimeoutExpired:
            raise DorylusError(f"{what}: still running after {timeout_s:.0f} s; see {log}") from None
    if code:
        raise DorylusError(f"{what} failed (exit {code}); see {log}")
