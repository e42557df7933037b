"""The head's read-only NFS export of its Hugging Face cache's hub/ folder (nfs-kernel-server, an /etc/exports.d
file, `exportfs -ra` on change) and the worker's docker volume of type nfs that mounts it.

Only hub/ is exported: the cache's top folder also holds the token `hf auth login` writes, which the worker never
needs. Before the pair step, `nfs_view_checked` makes sure the worker sees the served snapshot through the volume as
the head has it (a stale or half-mounted view would give rank 1 other files than rank 0)."""

from __future__ import annotations

import posixpath
import re
from io import StringIO
from typing import Any

import gevent
from pyinfra import host, state
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.api.host import Host
from pyinfra.context import ctx_config, ctx_host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, files

from operations.build.image_hash import image_ref
from operations.facts.docker import DockerVolumeInfo, VolumeContainers
from operations.facts.files import FileText
from operations.facts.nfs import ExportTable, SameFilesystem, SnapshotView, SnapshotViewDict, VolumeSnapshotView
from operations.layout import SERVED_SYMLINK
from operations.owned.files import owned_put_changes
from operations.owned.units import unit_service
from operations.settings.context import peer_host
from operations.util import check_failed, sh, warned
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
    # why: said once, by the plan; the executing run would ask the fact again and say it a second time
    if not state.is_executing and host.get_fact(SameFilesystem, path=cache, other=home):
        warned("the NFS export", shared_filesystem_note(cache, home))
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


def view_differences(head: SnapshotViewDict, worker: SnapshotViewDict) -> list[str]:
    """How the worker's view of the served snapshot differs from the head's: the snapshot its link leads to, then
    each file missing, extra, unreachable or of another size, in name order; [] when the two are equal."""
    found = []
    if worker["commit"] != head["commit"]:
        found.append(f"the served link leads to snapshot {worker['commit'] or '(nothing)'} on the worker but "
                     f"{head['commit'] or '(nothing)'} on the head")
    for name in sorted(set(head["files"]) | set(worker["files"])):
        theirs, mine = head["files"].get(name), worker["files"].get(name)
        if theirs == mine:
            continue
        if mine is None:
            found.append(f"{name} is missing on the worker")
        elif theirs is None:
            found.append(f"{name} is only on the worker")
        elif mine < 0:
            found.append(f"{name}'s blob cannot be reached from the worker")
        elif theirs < 0:
            found.append(f"{name}'s blob is missing on the head")
        else:
            found.append(f"{name} has {mine} bytes on the worker but {theirs} on the head")
    return found


def view_problem(head: SnapshotViewDict, worker: SnapshotViewDict, volume: str, shown: int = 8) -> str | None:
    """Why rank 1 must not start on this view of the checkpoint (naming the files that differ and the fix), or None
    when the worker sees through `volume` what the head has."""
    if head["error"]:
        return (f"the head's served snapshot could not be read ({head['error']}): run the whole deploy.py (its data "
                "step downloads the checkpoint and sets the served link)")
    if worker["error"]:
        return (f"the worker could not read the head's checkpoint through docker volume {volume} ({worker['error']}):"
                " check the share from the worker (docs/nfs.md, \"Checking the share by hand\"), or set "
                "worker_weights = \"copy\" to give the worker its own copy")
    differences = view_differences(head, worker)
    if not differences:
        return None
    more = f" (and {len(differences) - shown} more)" if len(differences) > shown else ""
    return (f"the worker sees the checkpoint through docker volume {volume} otherwise than the head has it, so rank 1 "
            f"would load other files than rank 0: {'; '.join(differences[:shown])}{more}. Fix: if the head was still "
            "writing the checkpoint, run again once it is whole; a mount still in use keeps its old view (a running "
            "rank 1 holds it: run stop.py, then deploy again); check the share by hand (docs/nfs.md, \"Checking "
            "the share by hand\"); or set worker_weights = \"copy\" to give the worker its own copy")


def _head_view(head: Host, config: Any, repo_folder: str) -> SnapshotViewDict:
    with ctx_host.use(head), ctx_config.use(config):  # a greenlet of its own starts with no pyinfra context
        return head.get_fact(SnapshotView, repo_folder=repo_folder, link=SERVED_SYMLINK)


@operation()
def worker_view_checked(head: Host, volume: str, image: str, head_repo_folder: str, repo_in_volume: str):
    """Worker, worker_weights = "nfs": the served snapshot as rank 1 will see it through `volume` (where the served
    link leads, each file's name and size, read in a throwaway container of `image`) must be the head's own view of
    `head_repo_folder`; otherwise the run stops before the pair step touches either rank. While planning, a view
    that cannot be read yet (the image not shipped, the checkpoint not downloaded) is left to the executing run."""
    theirs = gevent.spawn(_head_view, head, ctx_config.get(), head_repo_folder)  # its own connection, meanwhile
    mine = host.get_fact(VolumeSnapshotView, repo_folder=repo_in_volume, link=SERVED_SYMLINK, volume=volume,
                         image=image)
    head_view = theirs.get()
    problem = view_problem(head_view, mine, volume)
    settled = not (head_view["error"] or mine["error"])
    if (yield from check_failed("the worker's view of the checkpoint", [problem], settled=settled)):
        return
    host.noop(f"the worker sees snapshot {head_view['commit']} through {volume} as the head has it" if not problem
              else "the worker's view of the checkpoint is compared with the head's when the run executes")


@deploy("The worker's view of the head's checkpoint")
def nfs_view_checked(s) -> None:
    """With worker_weights = "nfs", before the pair step: the worker reads the head's served snapshot through the
    NFS volume as the head has it (worker_view_checked). Nothing on the head, nothing with a local copy."""
    if s.is_head or s.worker_weights != "nfs":
        return
    head = s.head.layout
    worker_view_checked(name="The worker sees the checkpoint through NFS as the head has it", head=peer_host(s),
                        volume=s.nfs_volume, image=image_ref(s), head_repo_folder=head.model_folder,
                        repo_in_volume=posixpath.relpath(head.model_folder, head.hub))


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
