"""End-to-end fixtures: the simulated pair of Sparks (tests/sim) and the real pyinfra CLI against it over SSH.

Fixtures (session-wide; the pair comes up once per session):
  sim_pair      -> Path of the site file for the simulated pair (the pair is up and ssh answers)
  site_file     -> the same Path
  run_pyinfra   -> run_pyinfra(*args, env=None, timeout=1800, as_json=True) -> PyinfraRun(data, stderr, returncode,
                   stdout): `python -m pyinfra *args --json` in the project root with SPARKFOLD_SITE set, without
                   this machine's Hugging Face variables and token (sim.deploy_env); data is the parsed JSON (None
                   when stdout held none); as_json=False leaves --json out (what a person reads).
                   e.g. run_pyinfra("inventory.py", "deploy.py", "--dry")
  sim_exec      -> sim_exec(role, cmd, user=None) -> CompletedProcess (text stdout/stderr, returncode); root unless
                   user is given; cmd is a shell string or an argv list
  sim           -> the tests.sim.sim module (set_memavail, ssh_argv, RAILS, ...)
Per test:
  converged_pair -> the pair converged with the default settings and serving (a deploy only when a quick check
                   says it is not, or an earlier test failed); every file uses it but for the tests marked
                   fresh_pair (test_deploy.py's first two, which start from fresh Sparks)

Environment: SPARKSIM_PAIR=N picks the pair (each xdist worker its own: tests/sim/pairs.py); SPARKSIM_REUSE=1 reuses
a running pair (default: recreate it at session start, so every session starts from fresh Sparks); SPARKSIM_DOWN=1
removes the pair at the end (default: it stays up for inspection; `python -m tests.sim.sim down` removes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.sim import sim as _sim  # noqa: E402

HOW_TO_GET = ("The end-to-end tests run the simulated pair of Sparks in containers: they need root, a Docker engine "
              "(apt-get install docker.io; setsid dockerd >/tmp/dockerd.log 2>&1 &), openssh-client and debootstrap. "
              ".ci/run installs and starts all of it on a fresh Debian machine.")


class PyinfraRun(NamedTuple):
    data: Any  # parsed --json output, or None
    stderr: str
    returncode: int
    stdout: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    e2e = [i for i in items if here in Path(str(i.fspath)).parents]
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    # the smoke test checks the pair as it starts, and test_deploy.py begins from fresh Sparks: both run before any
    # other e2e file changes the Sparks, whatever the other files are named
    leading = [i for name in ("test_sim_smoke.py", "test_deploy.py") for i in e2e if Path(str(i.fspath)).name == name]
    if leading:
        first = items.index(e2e[0])
        rest = [i for i in items if i not in leading]
        items[:] = rest[:first] + leading + rest[first:]


@pytest.fixture(scope="session")
def sim():
    return _sim


@pytest.fixture(scope="session")
def sim_pair() -> Path:
    problems = _sim.missing_prerequisites()
    if problems:
        pytest.fail(HOW_TO_GET + "\nMissing here:\n  - " + "\n  - ".join(problems), pytrace=False)
    try:
        path = _sim.up(fresh=os.environ.get("SPARKSIM_REUSE") != "1")
    except _sim.SimError as exc:
        pytest.fail(f"the simulated pair did not come up: {exc}", pytrace=False)
    yield path
    if os.environ.get("SPARKSIM_DOWN") == "1":
        _sim.down()


@pytest.fixture(scope="session")
def site_file(sim_pair) -> Path:
    return sim_pair


def _parse_json(stdout: str) -> Any:
    text = stdout.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    # a stray print before the payload: take the last line that parses
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(("{", "[")):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


@pytest.fixture(scope="session")
def run_pyinfra(sim_pair):
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 1800, as_json: bool = True) -> PyinfraRun:
        # without this machine's Hugging Face variables and token (tests/sim/sim.py deploy_env)
        full_env = _sim.deploy_env({"SPARKFOLD_SITE": str(sim_pair), **(env or {})})
        argv = [sys.executable, "-m", "pyinfra", *args]
        if as_json and "--json" not in args:
            argv.append("--json")
        proc = subprocess.run(argv, cwd=ROOT, env=full_env, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        # decoded by hand: text=True would turn a carriage return into a newline, where no test could see it
        out, err = (proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
        return PyinfraRun(_parse_json(out), err, proc.returncode, out)

    return run


@pytest.fixture(scope="session")
def sim_exec(sim_pair):
    def run(role: str, cmd, user: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return _sim.exec_in(role, cmd, user=user, timeout=timeout)

    return run


# --- a converged pair for each test -----------------------------------------------------------------------------

RANK_CONTAINER = "dsv41-1017-exl3-tf"  # container_name's default
SERVED_NAME = "DeepSeek-V4.1-Flash-1017"  # served_name's default


class _Pair:
    """What this session knows of the pair: the ranks' spec hashes right after the last converged deploy, and
    whether a test failed since (it may have stopped half-way through a change the quick check cannot see: a link
    address, a unit file, a stopped timer)."""

    hashes: tuple[str, str] | None = None
    suspect = False


def _spec_hashes(sim_exec) -> tuple[str, str]:
    """Each rank's spec hash while it runs ("" when it does not)."""
    found = []
    for role in ("head", "worker"):
        out = sim_exec(role, ["docker", "inspect", "-f", '{{.State.Running}} {{index .Config.Labels '
                                                          '"sparkfold.spec-hash"}}', RANK_CONTAINER])
        running, _, label = out.stdout.strip().partition(" ")
        found.append(label if out.returncode == 0 and running == "true" else "")
    return found[0], found[1]


def _api_serves() -> bool:
    """Rank 0's API lists the model without a key (api_key is off by default: a 401 means a test left it on)."""
    try:
        r = requests.get(f"http://127.0.0.1:{_sim.API_PORT}/v1/models", timeout=5)
        return r.status_code == 200 and SERVED_NAME in [m.get("id") for m in r.json().get("data", [])]
    except (requests.RequestException, ValueError):
        return False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and item.get_closest_marker("e2e"):
        _Pair.suspect = True  # the next converged_pair deploys, whatever its quick check says
    return report


@pytest.fixture
def converged_pair(request, run_pyinfra, sim_exec):
    """The pair converged with the default settings and serving, so a test (a file alone, or a -k subset) does not
    depend on the tests before it. The quick check: both ranks run the specs the last converged deploy of this
    session started and rank 0's API lists the model (two docker inspects and one GET). Otherwise, and on the first
    use in a session or after a failed test, it deploys (a converged deploy changes nothing and takes seconds). A
    test that changes the pair converges it again before it ends; one that fails midway leaves that to this."""
    if request.node.get_closest_marker("fresh_pair"):
        return
    if not _Pair.suspect and _Pair.hashes is not None and _spec_hashes(sim_exec) == _Pair.hashes and _api_serves():
        return
    run = run_pyinfra("inventory.py", "deploy.py", "-y")
    if run.returncode != 0:
        pytest.fail(f"converged_pair: the deploy failed:\n{run.stderr[-6000:]}", pytrace=False)
    _Pair.hashes, _Pair.suspect = _spec_hashes(sim_exec), False
