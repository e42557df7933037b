"""Docker with the NVIDIA runtime: daemon.json merge (other keys kept), restart exactly when needed, packages,
the docker group."""

import json
from pathlib import Path

from harness import parse_fact, run_op, with_args
from operations import docker_runtime as dr
from operations.facts.docker_daemon import ContainerRuntimeTools, DaemonJson, DockerRuntimeInfo, UserGroups

FIX = Path(__file__).parent / "fixtures" / "host"
PATH = "path=/etc/docker/daemon.json"
NVIDIA_LIVE = {"reachable": True, "default_runtime": "nvidia", "runtimes": ["io.containerd.runc.v2", "nvidia", "runc"]}
RUNC_LIVE = {"reachable": True, "default_runtime": "runc", "runtimes": ["io.containerd.runc.v2", "runc"]}


def daemon_facts(daemon_json, live):
    return {DaemonJson: with_args({PATH: daemon_json}), DockerRuntimeInfo: live}


# --- facts ---------------------------------------------------------------------------------------------------

def test_daemon_json_fact_reads_user_file():
    got = parse_fact(DaemonJson, (FIX / "daemon-json-user.json").read_text())
    assert got["exists"] and got["error"] is None
    assert got["config"]["data-root"] == "/data/docker" and "crun" in got["config"]["runtimes"]


def test_daemon_json_fact_missing_empty_malformed():
    assert parse_fact(DaemonJson, "##ABSENT##") == {"exists": False, "config": {}, "error": None}
    assert parse_fact(DaemonJson, "##EXISTS##\n") == {"exists": True, "config": {}, "error": None}
    bad = parse_fact(DaemonJson, (FIX / "daemon-json-bad.json").read_text())
    assert bad["config"] is None and "line" in bad["error"]
    assert parse_fact(DaemonJson, "##EXISTS##\n[1, 2]")["config"] is None


def test_runtime_info_and_tools_and_groups():
    live = parse_fact(DockerRuntimeInfo, 'info=nvidia|{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":'
                                          '"nvidia-container-runtime"},"runc":{"path":"runc"}}')
    assert live == NVIDIA_LIVE
    assert parse_fact(DockerRuntimeInfo, "##UNREACHABLE##")["reachable"] is False
    tools = parse_fact(ContainerRuntimeTools, "docker=yes\nnvidia-container-runtime=no\n")
    assert tools == {"docker": True, "nvidia-container-runtime": False}
    assert parse_fact(UserGroups, "nvidia adm sudo docker") == ["nvidia", "adm", "sudo", "docker"]
    assert parse_fact(UserGroups, "##NO_USER##") is None


# --- merge ---------------------------------------------------------------------------------------------------

def test_merge_keeps_every_other_key():
    user = parse_fact(DaemonJson, (FIX / "daemon-json-user.json").read_text())["config"]
    merged = dr.merged_daemon_config(user)
    assert merged["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "runtimeArgs": []}
    assert merged["runtimes"]["crun"] == {"path": "/usr/bin/crun"}
    assert merged["default-runtime"] == "nvidia"
    assert {k: v for k, v in merged.items() if k not in ("runtimes", "default-runtime")} == \
        {"log-driver": "json-file", "log-opts": {"max-size": "10m"}, "data-root": "/data/docker"}
    assert "default-runtime" not in user  # the input is not modified


# --- daemon_uses_nvidia --------------------------------------------------------------------------------------

def test_missing_file_is_written_and_docker_restarted_together():
    cmds, _ = run_op(dr.daemon_uses_nvidia, daemon_facts({"exists": False, "config": {}, "error": None}, RUNC_LIVE))
    assert cmds[0] == "mkdir -p /etc/docker"
    assert not any("sparkfold-backup" in c for c in cmds)  # nothing to back up
    upload = [c for c in cmds if c.startswith("FileUploadCommand")]
    assert len(upload) == 1 and "/etc/docker/daemon.json" in upload[0]
    assert cmds[-2] == "systemctl restart docker"
    assert "DefaultRuntime" in cmds[-1] and "exit 1" in cmds[-1]


def test_user_file_is_merged_backed_up_and_restart_follows(monkeypatch):
    written = {}
    real = dr.FileUploadCommand

    def capture(src, dest, *a, **k):
        written[dest] = src.getvalue()
        return real(src, dest, *a, **k)

    monkeypatch.setattr(dr, "FileUploadCommand", capture)
    current = parse_fact(DaemonJson, (FIX / "daemon-json-user.json").read_text())
    cmds, _ = run_op(dr.daemon_uses_nvidia, daemon_facts(current, NVIDIA_LIVE))
    assert "cp -p /etc/docker/daemon.json /etc/docker/daemon.json.sparkfold-backup" in cmds
    new = json.loads(written["/etc/docker/daemon.json"])
    assert new == dr.merged_daemon_config(current["config"]) and new["data-root"] == "/data/docker"
    assert cmds.index("systemctl restart docker") > cmds.index("chmod 644 /etc/docker/daemon.json")


def test_converged_changes_nothing():
    config = dr.merged_daemon_config({"log-driver": "json-file"})
    cmds, h = run_op(dr.daemon_uses_nvidia, daemon_facts({"exists": True, "config": config, "error": None},
                                                         NVIDIA_LIVE))
    assert cmds == [] and h.noops == ["docker uses the nvidia runtime"]


def test_right_file_but_stale_daemon_restarts_only():
    config = dr.merged_daemon_config({})
    cmds, _ = run_op(dr.daemon_uses_nvidia, daemon_facts({"exists": True, "config": config, "error": None},
                                                         RUNC_LIVE))
    assert cmds[0] == "systemctl restart docker" and len(cmds) == 2


def test_malformed_file_fails_and_is_never_written():
    bad = parse_fact(DaemonJson, (FIX / "daemon-json-bad.json").read_text())
    cmds, _ = run_op(dr.daemon_uses_nvidia, daemon_facts(bad, RUNC_LIVE))
    assert len(cmds) == 1 and "/etc/docker/daemon.json is not valid JSON" in cmds[0] and "exit 1" in cmds[0]
    assert "will not overwrite" in cmds[0]


# --- packages and group --------------------------------------------------------------------------------------

def test_runtime_installed_both_ways():
    have = {ContainerRuntimeTools: {"docker": True, "nvidia-container-runtime": True}}
    assert run_op(dr.runtime_installed, have)[0] == []
    missing = {ContainerRuntimeTools: {"docker": True, "nvidia-container-runtime": False}}
    cmds, _ = run_op(dr.runtime_installed, missing, install=True)
    assert len(cmds) == 1 and "apt-get install -y -qq nvidia-container-toolkit" in cmds[0]
    assert "docker.io" not in cmds[0].split("||")[0]
    cmds, _ = run_op(dr.runtime_installed, {ContainerRuntimeTools: {}}, install=False)
    assert "missing: docker.io, nvidia-container-toolkit" in cmds[0] and "docker_install = True" in cmds[0]
    assert "exit 1" in cmds[0]


def test_user_in_group_both_ways():
    facts = {UserGroups: with_args({"user=nvidia": ["nvidia", "sudo"]})}
    assert run_op(dr.user_in_group, facts, user="nvidia")[0] == ["usermod -aG docker nvidia"]
    facts = {UserGroups: with_args({"user=nvidia": ["nvidia", "docker"]})}
    assert run_op(dr.user_in_group, facts, user="nvidia")[0] == []
    facts = {UserGroups: with_args({"user=nvidia": None})}
    assert "does not exist" in run_op(dr.user_in_group, facts, user="nvidia")[0][0]
