"""The built wheel, installed (not editable) into a fresh venv, works from any directory.

Builds the wheel offline from a copy of the source tree (`pip wheel --no-deps
--no-build-isolation`, so the checkout gets no build/ or egg-info), installs it with `--no-deps`
into a new venv made `--without-pip` (its site-packages then holds only what our wheel put
there), and checks:
  * the only top-level names installed are `infer_cluster` and its dist-info (nothing generic
    like `client` or `worker` lands in site-packages);
  * `python -m infer_cluster --version` and the `infer-cluster` script run from /tmp, importing
    our package from the venv, not from the source tree;
  * `infer-cluster generate` runs the engine offline from /tmp.

Dependencies (torch, zmq, click, ...) are not installed into that venv (no network in CI, and
torch is large): a `.pth` file appends this interpreter's site-packages to the venv's path,
*after* the venv's own site-packages, so our installed wheel is found first and the source tree
is never on the path (PYTHONPATH is cleared). `--system-site-packages` would not do: it exposes
the base interpreter's packages, not this venv's, and would hide a missing file in the wheel
behind an editable install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.timeout(300)

IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".hypothesis", "results", "*.log")


def _run(argv, cwd, env, timeout=120) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{argv} failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_wheel_installs_one_namespace_and_runs_from_tmp(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INFER_CLUSTER_AUTH")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(wheels), str(src)], cwd=tmp_path, env=env, timeout=240)
    (wheel,) = wheels.glob("infer_cluster-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=env)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", "-q", str(wheel)], cwd=tmp_path, env=env, timeout=240)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd="/tmp", env=env).stdout.strip())
    names = sorted(p.name for p in site.iterdir() if p.name != "__pycache__")
    assert names == ["infer_cluster", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"], names

    # Borrow the dependencies (read-only) after our own site-packages; see the module docstring.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_borrowed_deps.pth").write_text("\n".join(sorted(deps)) + "\n")

    where = _run([str(python), "-c", "import infer_cluster.client, infer_cluster.worker.config as c; "
                  "print(infer_cluster.client.__file__); print(c.__file__)"], cwd="/tmp", env=env)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout

    version = _run([str(python), "-m", "infer_cluster", "--version"], cwd="/tmp", env=env)
    from infer_cluster import __version__
    assert version.stdout.strip() == f"infer-cluster {__version__}"
    gen = _run([str(venv / "bin" / "infer-cluster"), "--log-level", "WARNING", "generate",
                "--max-tokens", "4", "--ignore-eos", "Hello"], cwd="/tmp",
               env=dict(env, OMP_NUM_THREADS="1"), timeout=180)
    assert gen.stdout.strip(), gen.stderr
    assert "Traceback" not in gen.stderr
