"""The head's read-only NFS export of its Hugging Face cache's hub/ folder (nfs-kernel-server, an /etc/exports.d
file, `exportfs -ra` on change) and the worker's docker volume of type nfs that mounts it.

Only hub/ is exported: the cache's top folder also holds the token `hf auth login` writes, which the worker never
needs."""

from __future__ import annotations

import re
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files

from operations.facts.docker import DockerVolumeInfo, VolumeContainers
from operations.facts.files import FileText
from operations.facts.nfs import ExportTable, SameFilesystem
from operations.owned.files import owned_put_changes
from operations.owned.units import unit_service
from operations.util import check_failed, sh
from operations.util.commands import APT_CACHE_S
from operations.util.net import ip_of
from operations.util.owned import foreign_file_problem
from operations.util.templates import render

NFS_PACKAGE = "nfs-kernel-server"
NFS_SERVICE = "nfs-server"  # nfs-kernel-server.service is an alias of it on Ubuntu
# subtree_check: the server answers a file handle only for a file inside the exported folder. With no_subtree_check
# it answers one for any inode of that file system, and the default cache shares the home's (~/.ssh, the token).
EXPORT_OPTIONS = "ro,subtree_check"
MANAGED_LABEL = "sparkfold.managed"


def export_path_token(path: str) -> str:
    # exports(5): a path with blanks is written in double quotes
    return f'"{path}"' if re.search(r"\s", path) else path


def render_exports(path: str, clients: list[str], options: str = EXPORT_OPTIONS) -> str:
    return render("sparkfold.exports.j2", path=export_path_token(path), clients=clients, options=options)


def volume_options(server_ip: str, export_path: str, options: str) -> dict:
    """The local driver's options for an NFS volume, as `docker volume inspect` shows them."""
    return {"type": "nfs", "o": f"addr={server_ip},{options}", "device": f":{export_path}"}


@operation()
def nfs_server_installed(package: str = NFS_PACKAGE):
    """The NFS server package installed (apt.packages). Custom only so the apt index is refreshed when the package
    is missing: core's update=True would refresh it on converged runs too, once cache_time has passed."""
    if package in host.get_fact(DebPackages):
        host.noop(f"{package} is installed")
        return
    yield from apt.packages._inner(packages=[package], update=True, cache_time=APT_CACHE_S)


@operation()
def nfs_exported(path: str, clients: list[str], exports_file: str, options: str = EXPORT_OPTIONS):
    """Export `path` to each client in this project's exports file (files.put, mode 644; refused when the file is
    someone else's); `exportfs -ra` when the file changed or the live table lacks one of the entries. Custom: core
    writes the file, not the reload."""
    written = yield from owned_put_changes(StringIO(render_exports(path, clients, options)), exports_file, "644")
    if written is None:  # someone else's file: refused
        return
    yield from written
    # exportfs -v shows no_subtree_check when set and nothing for subtree_check: an entry showing it is outdated
    live = {(e["path"], e["client"]) for e in host.get_fact(ExportTable)
            if "ro" in e["options"] and "no_subtree_check" not in e["options"]}
    missing = [c for c in clients if (path, c) not in live]
    if not written and not missing:
        host.noop(f"{path} is exported to {', '.join(clients)}")
        return
    yield StringCommand("exportfs -ra")


def shared_filesystem_note(cache: str, home: str) -> str:
    return (f"hf_cache {cache} is on the same file system as {home}, the ssh user's home (~/.ssh, the Hugging Face "
            f"token): the worker, and anything on the cable that takes its link address, reaches {cache}/hub "
            "read-only, and a file handle outside that folder is refused only by the server's subtree check; put "
            "hf_cache on a file system of its own, or set worker_weights = \"copy\" and nfs = false to export "
            "nothing (docs/security.md)")


@operation()
def export_filesystem_checked(cache: str, home: str):
    """While planning, a warning when the exported cache shares a file system with the ssh user's home (a fact:
    the device of each, or of its nearest existing folder). Nothing changes; a run is not stopped by it."""
    if not state.is_executing and host.get_fact(SameFilesystem, path=cache, other=home):
        logger.warning(f"{host.name}: warning: {shared_filesystem_note(cache, home)}")
    host.noop(f"the file system of {cache} checked")
    yield from ()


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
        yield from check_failed("the NFS volume", [
            f"docker volume {volume} exists ({shown}) but sparkfold did not create it, so it is left alone: "
            f"remove it yourself (`docker volume rm {volume}`) or set nfs_volume to another name, then re-run"])
        return
    users = host.get_fact(VolumeContainers, volume=volume)
    if users:
        names = ", ".join(users)
        yield from check_failed("the NFS volume", [
            f"docker volume {volume} needs new options (o=addr={server_ip},{options} device=:{export_path}; "
            f"now {shown}) but container(s) {names} use it: stop and remove them (`docker rm -f {names}`; "
            f"sparkfold recreates its rank container on the next deploy), then re-run"])
        return
    yield StringCommand(sh("docker", "volume", "rm", volume))
    yield create


@operation()
def nfs_unexported(exports_file: str):
    """nfs = false: this project's exports file removed and the export table reloaded; a file at that path that
    sparkfold did not write is left alone."""
    text = host.get_fact(FileText, path=exports_file)
    if text is None or foreign_file_problem(exports_file, text):
        host.noop(f"no sparkfold export in {exports_file}")
        return
    yield StringCommand(sh("rm", "-f", exports_file))
    yield StringCommand("exportfs -ra")


@deploy("NFS share of the head's Hugging Face cache")
def nfs(s) -> None:
    """The export on the head, the volume on the worker; nothing when s.nfs is False. The server, its unit and the
    exports file need root; the cache folder and the docker volume belong to the ssh user (_sudo=False)."""
    if not s.nfs:
        if s.is_head:
            nfs_unexported(name=f"{s.nfs_exports_file} removed (nfs is off)", exports_file=s.nfs_exports_file,
                           _sudo=True)
        return
    if s.is_head:
        clients = [ip_of(r["address"]) for r in s.peer.link_rails]
        nfs_server_installed(name=f"{NFS_PACKAGE} installed", _sudo=True)
        unit_service(name=f"{NFS_SERVICE} enabled and running", service=f"{NFS_SERVICE}.service", file_put=None,
                     running=True, enabled=True, _sudo=True)
        # the export must exist before exportfs; created as the ssh user, who owns the cache
        files.directory(name="Hugging Face cache hub folder", path=s.layout.hub, present=True, _sudo=False)
        export_filesystem_checked(name="the exported cache's file system", cache=s.hf_cache, home=s.home,
                                  _sudo=False)
        nfs_exported(name="the cache's hub/ exported to the worker", path=s.layout.hub, clients=clients,
                     exports_file=s.nfs_exports_file, _sudo=True)
    else:
        nfs_volume(name="docker volume of the head's cache", volume=s.nfs_volume, server_ip=s.head_link_ip,
                   export_path=s.head.layout.hub, options=s.nfs_options, _sudo=False)
