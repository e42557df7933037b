"""The simulated pair is what the deploy expects to find: ssh as nvidia, sudo, its own dockerd that builds FROM the
engine base, the CX7 twins with no addresses, the head reaching the worker, systemd as PID 1 with every boot unit
up, the stand-ins shadowing real tools only where no real program can run here."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROLES = ("head", "worker")
STANDINS_DIR = Path(__file__).resolve().parents[1] / "sim" / "standins"
# what a real Spark has and this machine lacks (tests/sim/standins/, the README says why each remains)
EXPECTED_STANDINS = ("nvidia-smi", "nvidia-container-runtime", "nvidia-container-runtime-hook", "ib_write_bw")
# the real programs the simulated Spark runs instead of a stand-in
REAL_TOOLS = {"systemctl": "/usr/bin/systemctl", "systemd-run": "/usr/bin/systemd-run",
              "exportfs": "/usr/sbin/exportfs", "netplan": "/usr/sbin/netplan"}


def ssh(sim, role: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*sim.ssh_argv(role), command], text=True, capture_output=True, timeout=timeout)


def sim_exec_ls(sim, role: str) -> subprocess.CompletedProcess:
    """The stand-ins of the real tools, if any were left in /usr/local/bin (their lines; nothing when none)."""
    names = " ".join(f"/usr/local/bin/{n}" for n in REAL_TOOLS)
    return ssh(sim, role, f"ls {names} 2>/dev/null; true")


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("role", ROLES)
def test_ssh_as_nvidia_with_sudo_and_docker_group(sim, sim_pair, role):
    out = ok(ssh(sim, role, "id -un; hostname; sudo -n id -u; id -nG")).split("\n")
    assert out[0] == "nvidia"
    assert out[1] == role
    assert out[2] == "0"
    assert "docker" in out[3].split()


def test_pyinfra_cli_reaches_both_over_ssh(run_pyinfra):
    run = run_pyinfra("inventory.py", "fact", "server.Hostname")
    assert run.ok, run.stderr
    assert run.data == {"server.Hostname": {"sim-head": "head", "sim-worker": "worker"}}, run.stdout


@pytest.mark.parametrize("role", ROLES)
def test_inner_dockerd_answers_with_the_engine_base(sim, sim_pair, role):
    out = ok(ssh(sim, role, "docker info -f '{{.Driver}}'; docker image inspect -f '{{.Id}}' "
                            "sparkfold-sim/engine-base:bookworm"))
    driver, image_id = out.split()
    assert driver in ("overlay2", "vfs")
    assert image_id == (sim.WORK / "engine-base.id").read_text().strip()


def test_docker_build_from_engine_base_on_head(sim, sim_pair):
    script = (
        'set -e; d=$(mktemp -d); trap "rm -rf $d; docker rmi -f sparkfold-sim-smoke:1 >/dev/null 2>&1 || true" EXIT; '
        'printf "FROM sparkfold-sim/engine-base:bookworm\\nRUN python3 -c \\"import jinja2\\" && echo built >/m\\n'
        'CMD cat /m\\n" >$d/Dockerfile; docker build -q -t sparkfold-sim-smoke:1 $d >/dev/null; '
        "docker run --rm sparkfold-sim-smoke:1"
    )
    assert ok(ssh(sim, "head", script, timeout=300)).strip() == "built"


@pytest.mark.parametrize("role", ROLES)
def test_link_netdevs_exist_up_without_addresses(sim, sim_pair, sim_exec, role):
    now = {link["ifname"]: link for link in json.loads(ok(sim_exec(role, "ip -j addr show")))}
    initial = {link["ifname"]: link for link in json.loads(ok(sim_exec(role, "cat /run/sim/initial-addr.json")))}
    for netdev, _, _ in sim.RAILS:
        assert netdev in now, f"{netdev} missing on {role}: {sorted(now)}"
        assert "UP" in now[netdev]["flags"]
        # as the deploy first finds them: no IPv4 yet, a fresh Spark's MTU
        assert [a for a in initial[netdev].get("addr_info", []) if a.get("family") == "inet"] == []
        assert initial[netdev]["mtu"] == 1500
    # the management network stays the default route
    route = ok(sim_exec(role, "ip -j route show default"))
    assert json.loads(route)[0]["dev"] == "eth0"


def test_ping_and_ssh_over_the_link(sim, sim_pair, sim_exec):
    added = []
    try:
        for role in ROLES:
            present = ok(sim_exec(role, "ip -o -4 addr show"))
            for netdev, _, net in sim.RAILS:
                address = f"{net}.{sim.HOST_OCTET[role]}/24"
                if f" {address} " not in present:
                    ok(sim_exec(role, ["ip", "addr", "add", address, "dev", netdev]))
                    added.append((role, address, netdev))
        for netdev, _, net in sim.RAILS:
            # a do-not-fragment ping that fills the MTU, out of the rail's own netdev
            ok(sim_exec("head", f"ping -c 2 -W 2 -M do -s 1472 -I {netdev} {net}.2", user="nvidia"))
            ok(sim_exec("worker", f"ping -c 2 -W 2 -M do -s 1472 -I {netdev} {net}.1", user="nvidia"))
        # the head's key on the worker, its host key pre-seeded for the link addresses (no accept-new needed)
        rail0 = f"{sim.RAILS[0][2]}.2"
        out = ok(sim_exec("head", f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes nvidia@{rail0} hostname",
                          user="nvidia"))
        assert out.strip() == "worker"
    finally:
        for role, address, netdev in added:
            sim_exec(role, ["ip", "addr", "del", address, "dev", netdev])
    for role, address, netdev in added:
        assert address not in ok(sim_exec(role, ["ip", "-o", "addr", "show", "dev", netdev]))


def test_head_reaches_worker_by_management_name(sim_exec):
    out = ok(sim_exec("head", "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes nvidia@worker 'hostname; id -un'",
                      user="nvidia"))
    assert out.split() == ["worker", "nvidia"]


@pytest.mark.parametrize("name", EXPECTED_STANDINS)
def test_standin_shadows_the_real_tool(sim, sim_pair, name):
    assert (STANDINS_DIR / name).is_file(), f"tests/sim/standins/{name} is missing"
    for role in ROLES:
        out = ok(ssh(sim, role, f"command -v {name}; readlink -f \"$(command -v {name})\"; "
                                f"sudo -n sh -c 'command -v {name}'")).split()
        assert out == [f"/usr/local/bin/{name}", f"/opt/sim/standins/{name}", f"/usr/local/bin/{name}"], role


@pytest.mark.parametrize(("name", "path"), sorted(REAL_TOOLS.items()))
def test_the_real_tool_answers_where_a_stand_in_did(sim, sim_pair, name, path):
    for role in ROLES:  # as root, as the deploy runs them (/usr/sbin is on root's PATH only)
        assert ok(ssh(sim, role, f"sudo -n sh -c 'command -v {name}'")).split() == [path], role
        assert not ok(sim_exec_ls(sim, role)).strip(), role  # and no stand-in of that name is left behind


@pytest.mark.parametrize("role", ROLES)
def test_systemd_is_pid_1_and_every_boot_unit_is_up(sim_exec, role):
    assert ok(sim_exec(role, "cat /proc/1/comm")).strip() == "systemd"
    assert ok(sim_exec(role, "systemctl is-system-running")).strip() == "running"
    scripts = sorted(p.name for p in (STANDINS_DIR / "init.d").glob("*.sh"))
    assert "20-roce-gids.sh" in scripts, "tests/sim/standins/init.d/20-roce-gids.sh is missing"
    units = ["ssh.service", "docker.service", "sim-rank-memory.service", "sim-ready.service",
             *[f"sim-init@{s}.service" for s in scripts]] + (["sim-fakehub.service"] if role == "head" else [])
    states = ok(sim_exec(role, ["systemctl", "is-active", *units])).split()
    assert states == ["active"] * len(units), dict(zip(units, states, strict=True))
    # the ssh user asks systemd without sudo, as on a Spark (the deploy's facts do)
    assert ok(sim_exec(role, "systemctl show docker.service -p ActiveState --value", user="nvidia")).strip() == \
        "active"


def test_memavail_can_be_lowered(sim, sim_exec):
    def meminfo(role):
        meminfo_text = ok(sim_exec(role, "cat /proc/meminfo", user="nvidia"))
        fields = dict(line.split(":", 1) for line in meminfo_text.splitlines())
        return {k: int(v.split()[0]) for k, v in fields.items()}

    try:
        sim.set_memavail("worker", 100)
        assert meminfo("worker")["MemAvailable"] == 100 * 1024 * 1024
        assert meminfo("head")["MemAvailable"] == int(sim.MEM_AVAIL_GIB * 1024 * 1024)
    finally:
        sim.set_memavail("worker", sim.MEM_AVAIL_GIB)
    assert meminfo("worker")["MemAvailable"] == int(sim.MEM_AVAIL_GIB * 1024 * 1024)
    assert 120 * 1024 * 1024 < meminfo("worker")["MemTotal"] < 122 * 1024 * 1024


def test_head_api_port_is_published_on_loopback(sim, sim_exec):
    pidfile = "/tmp/sparkfold-sim-smoke-api.pid"
    server = (f"cd \"$(mktemp -d)\" && echo sparkfold-sim-api >index.html && echo $$ >{pidfile} && "
              f"exec timeout 30 python3 -m http.server {sim.HEAD_API_PORT} --bind 0.0.0.0")
    proc = subprocess.Popen(["docker", "exec", "-u", "nvidia", sim.CONTAINER["head"], "bash", "-c", server],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        body, deadline = None, time.monotonic() + 15
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{sim.API_PORT}/", timeout=2) as resp:
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.3)
        assert body is not None and "sparkfold-sim-api" in body, proc.stderr.read() if proc.poll() is not None else ""
    finally:
        sim_exec("head", f"kill \"$(cat {pidfile})\" 2>/dev/null; rm -f {pidfile}")
        proc.wait(timeout=10)


def test_fake_hub_answers_on_the_head(sim_exec):
    out = ok(sim_exec("head", "curl -sf http://127.0.0.1:5555/healthz", user="nvidia"))
    assert json.loads(out)["ok"] is True


def test_dockerd_restart_keeps_images(sim, sim_pair):
    out = ok(ssh(sim, "worker", "sudo -n systemctl restart docker && docker image inspect -f '{{.Id}}' "
                               "sparkfold-sim/engine-base:bookworm", timeout=180))
    assert out.split()[-1] == (sim.WORK / "engine-base.id").read_text().strip()
