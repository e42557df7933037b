"""The head's read-only NFS export of its Hugging Face cache (nfs-kernel-server, an /etc/exports.d file,
`exportfs -ra` on change) and the worker's docker volume of type nfs that mounts it."""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.operations import files

from operations.facts.nfs import DebInstalled, DockerVolumeInfo, ExportTable, FileContent, ServiceState, VolumeContainers
from operations.link import ip_of, render_template, write_file_command
from operations.util import fail_command, sh

NFS_PACKAGE = "nfs-kernel-server"
NFS_SERVICE = "nfs-server"  # nfs-kernel-server.service is an alias of it on Ubuntu
EXPORT_OPTIONS = "ro,no_subtree_check"
MANAGED_LABEL = "sparkfold.managed"


def export_path_token(path: str) -> str:
    # exports(5): a path with blanks is written in double quotes
    return f'"{path}"' if re.search(r"\s", path) else path


def render_exports(path: str, clients: list[str], options: str = EXPORT_OPTIONS) -> str:
    return render_template("sparkfold.exports.j2", path=export_path_token(path), clients=clients, options=options)


def volume_options(server_ip: str, export_path: str, options: str) -> dict:
    """The local driver's options for an NFS volume, as `docker volume inspect` shows them."""
    return {"type": "nfs", "o": f"addr={server_ip},{options}", "device": f":{export_path}"}


@operation()
def nfs_server_installed(package: str = NFS_PACKAGE):
    """Install the NFS server package (apt) when it is missing."""
    if host.get_fact(DebInstalled, package=package):
        host.noop(f"{package} is installed")
        return
    yield StringCommand("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y " + sh(package))


@operation()
def nfs_server_running(service: str = NFS_SERVICE):
    """Enable and start the NFS server unit when it is not active and enabled."""
    current = host.get_fact(ServiceState, service=service)
    if current["active"] == "active" and current["enabled"] in ("enabled", "static", "alias"):
        host.noop(f"{service} is running")
        return
    yield StringCommand(sh("systemctl", "enable", "--now", service))


@operation()
def nfs_exported(path: str, clients: list[str], exports_file: str, options: str = EXPORT_OPTIONS):
    """Export `path` to each client in this project's exports file; `exportfs -ra` when the file changed or the
    live table lacks one of the entries."""
    want = render_exports(path, clients, options)
    file_changed = host.get_fact(FileContent, path=exports_file) != want
    if file_changed:
        yield write_file_command(exports_file, want, mode="644")
    live = {(e["path"], e["client"]) for e in host.get_fact(ExportTable) if "ro" in e["options"]}
    missing = [c for c in clients if (path, c) not in live]
    if not file_changed and not missing:
        host.noop(f"{path} is exported to {', '.join(clients)}")
        return
    yield StringCommand("exportfs -ra")


@operation()
def nfs_volume(volume: str, server_ip: str, export_path: str, options: str):
    """A docker volume (local driver, type nfs) mounting the head's export; recreated only when its options
    differ, this project created it, and no container uses it."""
    want = volume_options(server_ip, export_path, options)
    info = host.get_fact(DockerVolumeInfo, volume=volume)
    create = StringCommand(
        "docker volume create --driver local"
        f" --opt {sh('type=' + want['type'])} --opt {sh('o=' + want['o'])} --opt {sh('device=' + want['device'])}"
        f" --label {sh(MANAGED_LABEL + '=1')} {sh(volume)}"
    )
    if info is None:
        yield create
        return
    have = info.get("Options") or {}
    if info.get("Driver") == "local" and have == want:
        host.noop(f"volume {volume} mounts {server_ip}:{export_path}")
        return
    shown = f"driver {info.get('Driver')}, " + ", ".join(f"{k}={v}" for k, v in sorted(have.items()))
    if (info.get("Labels") or {}).get(MANAGED_LABEL) != "1":
        yield fail_command(
            f"docker volume {volume} exists ({shown}) but sparkfold did not create it, so it is left alone: "
            f"remove it yourself (`docker volume rm {volume}`) or set nfs_volume to another name, then re-run"
        )
        return
    users = host.get_fact(VolumeContainers, volume=volume)
    if users:
        names = ", ".join(users)
        yield fail_command(
            f"docker volume {volume} needs new options (o=addr={server_ip},{options} device=:{export_path}; "
            f"now {shown}) but container(s) {names} use it: stop and remove them (`docker rm -f {names}`; "
            f"sparkfold recreates its rank container on the next deploy), then re-run"
        )
        return
    yield StringCommand(sh("docker", "volume", "rm", volume))
    yield create


def deploy_nfs(s, head_hf_cache: str | None = None) -> None:
    """Step 5 of deploy.py: the export on the head, the volume on the worker. Nothing when s.nfs is False.

    head_hf_cache: the head's Hugging Face cache path, which the worker mounts (defaults to
    s.head_hf_cache when Settings has it, else s.hf_cache, the same path on both Sparks).
    """
    if not s.nfs:
        return
    if s.is_head:
        clients = [ip_of(r["address"]) for r in s.peer_link_rails]
        nfs_server_installed(name="NFS: nfs-kernel-server installed", _sudo=True)
        nfs_server_running(name="NFS: nfs-server running", _sudo=True)
        # the export must exist before exportfs; created as the ssh user, who owns the cache
        files.directory(name="NFS: Hugging Face cache directory", path=s.hf_cache, present=True)
        nfs_exported(name="NFS: export the Hugging Face cache to the worker", path=s.hf_cache, clients=clients,
                     exports_file=s.nfs_exports_file, _sudo=True)
    else:
        export_path = head_hf_cache or getattr(s, "head_hf_cache", None) or s.hf_cache
        nfs_volume(name="NFS: docker volume for the head's cache", volume=s.nfs_volume, server_ip=s.head_link_ip,
                   export_path=export_path, options=s.nfs_options)
