"""The deploy files agree with the code: the Docker image copies every source folder the
distribution maps (setup.cfg `package_dir`), and every Kubernetes container's `args` and
`INFER_CLUSTER_*` variables are ones the real CLI accepts (parsed by click, not run)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import click
import pytest
import yaml

from infer_cluster.cli import main

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _package_dirs() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = [line.strip() for line in cfg["options"]["package_dir"].splitlines() if line.strip()]
    return {line.split("=", 1)[1].strip() for line in lines}


def test_the_image_copies_every_package_folder():
    copied = set(re.findall(r"^COPY (\S+) \1$", (DEPLOY / "docker/Dockerfile").read_text(), re.M))
    missing = _package_dirs() - copied
    assert not missing, f"deploy/docker/Dockerfile does not COPY {sorted(missing)}"


def test_the_distribution_lists_every_package_folder():
    # setup.cfg names packages one by one: a new sub-package left out installs without its files
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    listed = {line.strip() for line in cfg["options"]["packages"].splitlines() if line.strip()}
    mapped = {}
    for line in cfg["options"]["package_dir"].splitlines():
        if line.strip():
            name, folder = (part.strip() for part in line.split("=", 1))
            mapped[name] = REPO / folder
    found = set()
    for name, folder in mapped.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            if "__pycache__" not in rel.parts:
                found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), f"setup.cfg packages misses {sorted(found - listed)}"


def _containers():
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                yield pytest.param(container, id=f"{path.name}:{container['name']}")


def _cli_envvars() -> set[str]:
    names = set()
    for command in [main, *main.commands.values()]:
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or [])
    return names


@pytest.mark.parametrize("container", list(_containers()))
def test_k8s_args_and_variables_are_the_cli_s(container):
    args = container["args"]
    command = main.get_command(click.Context(main), args[0])
    assert command is not None, f"no command {args[0]!r}"
    command.make_context(args[0], list(args[1:]))  # raises on an unknown option or a bad value
    ours = {e["name"] for e in container.get("env", []) if e["name"].startswith("INFER_CLUSTER_")}
    unknown = ours - _cli_envvars() - {"INFER_CLUSTER_AUTH"}
    assert not unknown, f"variables no option reads: {sorted(unknown)}"


def test_the_gateway_manifest_serves_with_keys():
    docs = list(yaml.safe_load_all((DEPLOY / "k8s/gateway.yaml").read_text()))
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {"INFER_CLUSTER_AUTH", "INFER_CLUSTER_API_KEY_FILE"} <= set(env)
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert any(env["INFER_CLUSTER_API_KEY_FILE"].startswith(m + "/") for m in mounts)
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"


def _unit_commands():
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        match = re.search(r"-m infer_cluster (\w+) ([^']*)'", path.read_text())
        if match:  # units of `python -m infer_cluster COMMAND` (the replica unit runs the worker)
            yield pytest.param(match.group(1), match.group(2), id=path.name)


@pytest.mark.parametrize("name, flags", list(_unit_commands()))
def test_systemd_commands_parse(name, flags):
    # ${PORT}-style variables come from the env file: any port, any address will do here
    flags = re.sub(r"\$\(\([^)]*\)\)", "5556", flags)
    flags = re.sub(r"\$\{(\w*PORT\w*)\}", "5555", flags)
    flags = re.sub(r"\$\{\w+\}", "tcp://127.0.0.1:5555", flags)
    command = main.get_command(click.Context(main), name)
    assert command is not None, f"no command {name!r}"
    command.make_context(name, flags.split())
