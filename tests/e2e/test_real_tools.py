"""The files sparkfold renders for the system, checked by the real tools inside a simulated Spark (Debian's packages
in tests/sim/Dockerfile, run by full path so the stand-ins on PATH are bypassed): the netplan file by `netplan
generate`, every unit by `systemd-analyze verify`, the exports file by nfs-utils' `exportfs -ra` (it parses the
file without kernel nfsd). Rendered here with the default settings and with the strangest accepted values of
tests/unit/test_hostile_input.py; one broken file per tool shows that each check can fail.

Runs in a container of its own from the simulated Spark's image (built by tests/sim/build.sh, as `up` does), so the
pair is neither needed nor touched.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from settings_factory import make_pair  # noqa: E402
from test_hostile_input import STRANGE  # noqa: E402

from operations import gpu_clock, link, memguard, nfs, supervise  # noqa: E402

NETPLAN = "/usr/sbin/netplan"
ANALYZE = "/usr/bin/systemd-analyze"
EXPORTFS = "/usr/sbin/exportfs"
WHERE = "/tmp/sparkfold-real-tools"
BOX = f"sparkfold-sim-realtools-{os.getpid()}"


@pytest.fixture(scope="module")
def box(sim):
    """run(cmd) -> CompletedProcess as root in a simulated Spark's image; cmd a shell string or an argv list."""
    problems = sim.missing_prerequisites()
    if problems:
        pytest.fail("the real-tool checks need the simulated Spark's image:\n  - " + "\n  - ".join(problems),
                    pytrace=False)
    sim.build()
    subprocess.run(["docker", "run", "-d", "--rm", "--name", BOX, "--entrypoint", "sleep", sim.IMAGE, "infinity"],
                   check=True, capture_output=True)

    def run(cmd) -> subprocess.CompletedProcess:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.run(["docker", "exec", BOX, *argv], capture_output=True, text=True, timeout=120)

    yield run
    subprocess.run(["docker", "rm", "-f", BOX], capture_output=True)


def rendered(overrides: dict) -> dict[str, str]:
    """Every file sparkfold writes for the system, as the deploy renders it for the head."""
    head, _worker = make_pair(head=overrides, worker=overrides)
    clients = [r["address"].split("/")[0] for r in head.peer.link_rails]
    return {
        "60-sparkfold-cx7.yaml": link.render_netplan([dict(r) for r in head.link_rails], head.link_mtu),
        "sparkfold-gpu-clock.service": gpu_clock.render_unit(head.gpu_clock_mhz, head.nvidia_smi_path,
                                                             head.gpu_clock_period_s),
        "sparkfold-gpu-clock.timer": gpu_clock.render_timer(head.gpu_clock_mhz, head.gpu_clock_period_s),
        "sparkfold-memguard.service": memguard.render_unit(head.container_name, head.memguard_gib),
        "sparkfold-supervise.service": supervise.render_unit(head.container_name, head.worker_link_ssh,
                                                             head.ssh_user, head.supervise_retries,
                                                             head.supervise_backoff_s, head.stop_timeout,
                                                             head.min_avail_gib),
        "sparkfold.exports": nfs.render_exports(head.layout.hub, clients),
        "nvidia-smi": head.nvidia_smi_path,  # the gpu unit's ExecStart must name an executable
        "hub": head.layout.hub,  # exportfs looks the exported folder up
    }


def broken(files: dict[str, str]) -> dict[str, str]:
    """The same files with one mistake each, of the kind each tool exists to catch."""
    out = dict(files)
    out["60-sparkfold-cx7.yaml"] = files["60-sparkfold-cx7.yaml"].replace("/24", "")  # no prefix length
    unit = "sparkfold-memguard.service"
    out[unit] = files[unit].replace("ExecStart=/usr/bin/python3", "ExecStart=bin/python3")  # not absolute
    out["sparkfold.exports"] = files["sparkfold.exports"].replace("(ro", "(ro,no_such_option")
    return out


def push(box, case: str, files: dict[str, str], tmp_path: Path) -> str:
    local = tmp_path / case
    local.mkdir()
    for name, text in files.items():
        if name not in ("nvidia-smi", "hub"):
            (local / name).write_text(text)
    dest = f"{WHERE}/{case}"
    box(f"rm -rf {dest} && mkdir -p {WHERE}")
    subprocess.run(["docker", "cp", str(local), f"{BOX}:{dest}"], check=True, capture_output=True)
    return dest


def netplan_generate(box, dest: str) -> subprocess.CompletedProcess:
    root = f"{dest}/netplan-root"
    return box(f"set -e; mkdir -p {root}/etc/netplan; install -m 600 {dest}/60-sparkfold-cx7.yaml "
                            f"{root}/etc/netplan/; {NETPLAN} generate --root-dir {root} && "
                            f"cat {root}/run/systemd/network/*.network")


def verify_units(box, dest: str, nvidia_smi: str) -> dict[str, subprocess.CompletedProcess]:
    # the gpu unit's ExecStart names nvidia-smi, which systemd-analyze wants to find executable, as on a Spark
    q = shlex.quote(nvidia_smi)
    box(f"test -x {q} || {{ mkdir -p \"$(dirname {q})\" && printf '#!/bin/sh\\n' > {q} && chmod +x {q}; }}")
    units = ("sparkfold-gpu-clock.service", "sparkfold-memguard.service", "sparkfold-supervise.service")
    results = {unit: box([ANALYZE, "verify", "--man=no", f"{dest}/{unit}"]) for unit in units}
    # a timer is checked with the service it starts (given beside it, as it is installed)
    timer = "sparkfold-gpu-clock.timer"
    results[timer] = box([ANALYZE, "verify", "--man=no", f"{dest}/{timer}", f"{dest}/sparkfold-gpu-clock.service"])
    return results


def exportfs_check(box, dest: str, hub: str) -> subprocess.CompletedProcess:
    return box(f"set -e; rm -rf /etc/exports.d; mkdir -p /etc/exports.d {shlex.quote(hub)}; "
               f"cp {dest}/sparkfold.exports /etc/exports.d/; {EXPORTFS} -ra; {EXPORTFS} -v")


@pytest.mark.parametrize("case", ["defaults", "strange"])
def test_every_rendered_file_passes_the_real_tool(box, tmp_path, case):
    files = rendered({} if case == "defaults" else STRANGE)
    dest = push(box, case, files, tmp_path)

    gen = netplan_generate(box, dest)
    assert gen.returncode == 0, gen.stderr
    for rail in make_pair()[0].link_rails:  # networkd got each rail's address
        assert f"Name={rail['netdev']}" in gen.stdout and f"Address={rail['address']}" in gen.stdout, gen.stdout

    for unit, result in verify_units(box, dest, files["nvidia-smi"]).items():
        assert result.returncode == 0 and not result.stderr.strip(), (unit, result.stderr)

    exp = exportfs_check(box, dest, files["hub"])
    assert exp.returncode == 0 and "exportfs:" not in exp.stderr, exp.stderr
    table = " ".join(exp.stdout.split())
    assert files["hub"] in table and "(ro," not in exp.stderr and ",ro," in table, exp.stdout


def test_each_real_tool_refuses_a_broken_file(box, tmp_path):
    files = broken(rendered({}))
    dest = push(box, "broken", files, tmp_path)
    gen = netplan_generate(box, dest)
    assert gen.returncode != 0 and "prefix" in gen.stderr, gen.stderr
    results = verify_units(box, dest, files["nvidia-smi"])
    bad = results["sparkfold-memguard.service"]
    assert bad.returncode != 0 and "bin/python3" in bad.stderr, bad.stderr
    assert results["sparkfold-gpu-clock.service"].returncode == 0  # only the broken one fails
    exp = exportfs_check(box, dest, files["hub"])
    assert exp.returncode != 0 and "no_such_option" in exp.stderr, exp.stderr
