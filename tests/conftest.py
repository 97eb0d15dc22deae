"""Suite-wide test settings.

Hypothesis runs derandomized (a fixed example sequence per test), so CI is reproducible: a
property that fails, fails every time, and a pass is not luck of the draw.

Parallel runs (`make test`: pytest-xdist workers with `--dist loadgroup`): tests that share an
expensive set-up run on one worker, so each set-up is made once per run, not once per worker. A
test joins the group of every module-, package- or session-scoped fixture defined under tests/
that it uses (a real cluster, a tokenizer, a converted model and their references) and of its
`xdist_group` marks; tests that share any of these, directly or through another test, form one
group. Everything else is handed out test by test. The workers write the groups to a file that
the controller's scheduler reads (xdist 3.8 marks groups by rewriting node ids, which pytest 9.2
ignores). Each worker keeps torch, and the processes its tests start, to its share of the cores.

Under TRITON_INTERPRET=1 the interpreter skips re-patching `triton.language` on every helper call
inside a kernel (tests/triton_interpreter.py): the same results, a quarter less time.
"""

import json
import os
import socket
import tempfile

import pytest
from hypothesis import settings

settings.register_profile("infer-cluster", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("infer-cluster")

GROUPS_FILE = "INFER_CLUSTER_TEST_GROUPS"  # environment: where the workers write the groups
# Session fixtures too cheap to be worth pinning their users to one worker.
SPREAD = {"dist_checkpoints", "checkpoints"}
# Folders whose tests take seconds each (whole models under the Triton interpreter, real
# processes), in the order a parallel run starts them; other folders follow in their own order,
# so the many short kernel and unit tests fill the end of the run on every worker.
LONG_FIRST = ("parity", "loading", "structured", "distributed", "integration", "engine")


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _grouping(config) -> bool:
    """Whether this run groups: the controller has `--dist loadgroup`, xdist's workers run with
    dist "no" and its `loadgroup` flag."""
    return config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False)


def pytest_configure(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        from tests.triton_interpreter import install

        install()
    if _is_worker(config):
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
        share = max(1, (os.cpu_count() or 1) // workers)
        import torch

        torch.set_num_threads(share)
        os.environ["OMP_NUM_THREADS"] = str(share)
    elif _grouping(config) and config.getoption("numprocesses", None):
        fd, path = tempfile.mkstemp(prefix="infer-cluster-test-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS_FILE] = path  # the workers start after this and inherit it
        config.add_cleanup(lambda: os.path.exists(path) and os.unlink(path))


def _shared_setups(item) -> list[str]:
    """Keys of what `item` shares with other tests: its module-, package- and session-scoped
    fixtures defined under tests/ (a conftest.py or a test module: a non-empty `baseid`) and its
    `xdist_group` marks."""
    keys = [f"mark:{m.args[0] if m.args else m.kwargs.get('name', 'default')}"
            for m in item.iter_markers("xdist_group")]
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames if info is not None else ():
        defs = info.name2fixturedefs.get(name)
        if not defs or name in SPREAD:
            continue
        fixture = defs[-1]
        if not fixture.baseid or fixture.scope not in ("module", "package", "session"):
            continue
        where = item.module.__name__ if fixture.scope == "module" else fixture.baseid
        keys.append(f"{fixture.scope}:{where}:{name}")
    return keys


def _groups(items) -> dict:
    """item -> group name, for the items that share a set-up with others (union-find over keys)."""
    parent: dict[str, str] = {}

    def find(key):
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    per_item = [(item, _shared_setups(item)) for item in items]
    for _, keys in per_item:
        for other in keys[1:]:
            parent[find(other)] = find(keys[0])
    return {item: find(keys[0]) for item, keys in per_item if keys}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    unmarked = [item.nodeid for item in items if _needs_cuda(item) and item.get_closest_marker("gpu") is None]
    if unmarked:  # `make test-gpu` selects `-m gpu`: these would never run anywhere
        files = sorted({nodeid.split("::")[0] for nodeid in unmarked})
        raise pytest.UsageError(f"{len(unmarked)} tests skip without CUDA but lack the gpu marker "
                                f"(in {', '.join(files)}), e.g. {unmarked[0]}")
    if _is_worker(config) and _grouping(config):
        first = {name: i for i, name in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: first.get(item.nodeid.split("/")[1], len(LONG_FIRST)))


def _needs_cuda(item) -> bool:
    """Whether the test skips where CUDA is missing (a skipif whose reason names CUDA)."""
    return any("CUDA" in str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Each worker writes {node id: group} before it reports its collection (every worker
    collects the same tests, so any one's file will do)."""
    path = os.environ.get(GROUPS_FILE)
    if not (path and _is_worker(session.config) and _grouping(session.config)):
        return
    groups = {item.nodeid: name for item, name in _groups(session.items).items()}
    tmp = f"{path}.{session.config.workerinput['workerid']}"
    with open(tmp, "w") as f:
        json.dump(groups, f)
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    path = os.environ.get(GROUPS_FILE)
    if not path or config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling (whole units to one worker, the biggest first) with the
        workers' groups as units; a test in no group is a unit of its own."""

        groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                with open(path) as f:
                    self.groups = json.load(f)
            return self.groups.get(nodeid, nodeid)

    return SharedSetupScheduling(config, log)


PORT_SLICE = 2000  # ports each pytest-xdist worker hands out, below the ephemeral range


def _port_slice() -> tuple[int, int]:
    """This worker's ports: [start, stop), below the kernel's ephemeral range, one slice a worker."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    slices = max(1, (low - 10000) // PORT_SLICE)
    start = low - PORT_SLICE * (1 + index % slices)
    return start, start + PORT_SLICE


_next_port: list = []  # this worker's next candidate (a random start: runs do not reuse ports)


def free_port() -> int:
    """A TCP port free on loopback now; tests that start processes bind it next. Why not the
    kernel's pick (`bind(0)`): that is an ephemeral port, the kind every outgoing connection of
    the suite's clients and replicas takes, so one of them could take it before the process
    binds it. These ports lie below the ephemeral range, in a slice of this xdist worker's own,
    handed out in turn from a random start."""
    start, stop = _port_slice()
    if start < 1024:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    if not _next_port:
        _next_port.append(start + int.from_bytes(os.urandom(2), "little") % PORT_SLICE)
    for _ in range(PORT_SLICE):
        port = _next_port[0]
        _next_port[0] = start + (port + 1 - start) % PORT_SLICE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {start}-{stop}")
