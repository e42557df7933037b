"""The engine image on both Sparks.

Built on the head from the build context (zig/ by default), tagged `<engine_image>:<content hash>`, then streamed to
the worker (`docker save | ssh | docker load`) when the worker's copy differs. With `prebuilt_image` set, both Sparks
pull that `name@sha256:<digest>` instead. The build and the ship (or the pull) run in the background
(operations/streams) from the start of the data step: `engine_image` uploads the context and starts them, and once
every stream has finished `engine_image_checked` reads `tensorfold-native capabilities --json` from the image and
keeps it by image id (`engine_capabilities_checked`): the launch step checks rank 0's flags against that document
(`read_capabilities`).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import FileUploadCommand, deploy, operation
from pyinfra.operations import docker

from operations.build import image_hash as content
from operations.build.image_hash import HASH_LABEL, IMAGE_STREAM, computed_hash, image_ref
from operations.facts.docker import (
    CapabilitiesDict,
    DockerImageInfo,
    EngineCapabilities,
    PeerDockerImageInfo,
    keep_command,
)
from operations.remote.progress_command import progress_command
from operations.settings import PREBUILT_REFERENCE, Settings
from operations.streams import Stream, background
from operations.util import check_failed, failing_shell, sh
from operations.util.fact_reuse import fact_until_change
from operations.util.peer_ssh import ssh_words

ENGINE_FAMILY = ("deepseek_v41", "exl3-mul1")  # model_type and format the served checkpoint needs
_PREBUILT = PREBUILT_REFERENCE
# Id, then layers and labels: the Id alone differs between Docker's overlay2 and containerd image stores.
_IDENTITY_FORMAT = "{{.Id}} {{json .RootFS.Layers}}{{json .Config.Labels}}"

# a build step line: the classic builder's "Step 3/9 : RUN ..." and BuildKit's "#7 [3/9] RUN ..."
BUILD_STEP = r"^(Step [0-9]+/[0-9]+|#[0-9]+ \[)"
# a pull's layer line: "<layer>: Downloading", "Extracting", "Pull complete", "Digest: ..."
PULL_STEP = r"^([0-9a-f]{12}: |Digest: |Status: )"


# --- pure helpers ---


def parse_prebuilt(reference: str) -> tuple[str, str]:
    """'name@sha256:<64 hex>' → (name, 'sha256:<hex>'); ValueError naming the setting otherwise."""
    match = _PREBUILT.fullmatch(reference.strip())
    if not match:
        raise ValueError(
            f"prebuilt_image {reference!r} is not name@sha256:<64 hex>; pin the published image by its digest"
            " (docker buildx imagetools inspect NAME:TAG shows it) or set prebuilt_image = \"\" to build"
        )
    return match["name"], match["digest"]


def same_image(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two DockerImageInfo summaries name the same image: equal ids, or (across image stores) equal layers+labels."""
    if not a or not b:
        return False
    if a["id"] and a["id"] == b["id"]:
        return True
    return bool(a["layers"]) and a["layers"] == b["layers"] and a["labels"] == b["labels"]


def capabilities_problem(caps: dict, image: str) -> str | None:
    """None when the capabilities document can drive the launch's flag check, else what is wrong."""
    if not caps:
        return (
            f"could not read `tensorfold-native capabilities --json` from {image}: the image is missing or its"
            f" engine does not run; remove it (docker image rm {image}) and rerun the deploy to rebuild it,"
            " or check prebuilt_image"
        )
    if caps.get("schema") != 1:
        return f"{image}: capabilities schema {caps.get('schema')!r} is not 1; this deploy knows schema 1 only"
    flags = (caps.get("serve") or {}).get("flags")
    if not isinstance(flags, dict) or not flags:
        return f"{image}: capabilities lists no serve flags; the engine cannot serve"
    family, fmt = ENGINE_FAMILY
    if fmt not in ((caps.get("families") or {}).get(family) or []):
        return f"{image}: the engine does not load {family} checkpoints in {fmt}; check tf_ref and the patches"
    return None


def capabilities_read(image: str, cache_dir: str) -> CapabilitiesDict:
    """Inside an operation: the EngineCapabilities of `image` (from cache_dir when kept there), read once until an
    operation changes a Spark."""
    return fact_until_change(host, EngineCapabilities, image=image, cache_dir=cache_dir)


def read_capabilities(image: str, cache_dir: str) -> dict:
    """Inside an operation (e.g. the launch step): the parsed capabilities document of `image` ({} if absent), kept
    in cache_dir (Layout.capabilities_cache) by image id. Flags: `caps["serve"]["flags"]` maps "--flag" to {} or
    {"values": [...]}."""
    return capabilities_read(image, cache_dir)["document"]


def capabilities_kept(cache_dir: str, image_id: str, document: dict) -> str:
    """The command that keeps `document` as the cache file of `image_id`: one JSON line written aside, then renamed,
    so a reader never sees half of it."""
    return keep_command(cache_dir, image_id, ".json", json.dumps(document))


def _ssh(target: str, remote_command: str) -> str:
    return sh(*ssh_words(), target, remote_command)


def build_command(image: str, image_hash: str, build_args: dict, build_dir: str, *, every: int) -> str:
    """docker build of build_dir as `image`, labelled with its hash, with a progress line every `every` seconds (the
    classic builder's "Step N/M", BuildKit's "#N [k/m]")."""
    words = ["docker", "build"]
    for name, value in sorted({**build_args, "IMAGE_HASH": image_hash}.items()):
        words += ["--build-arg", f"{name}={value}"]
    words += ["--label", f"{HASH_LABEL}={image_hash}", "-t", image, build_dir]
    return progress_command(f"build {image}", sh(*words), latest=BUILD_STEP, every=every).get_raw_value()


def ship_commands(image: str, worker_ssh: str, total: int = 0, *, every: int) -> list[str]:
    """Stream `image` from this host (the head) to the worker (`total`: its size, when known), then check both hold
    the same image; only the Spark can tell, after the transfer: the failure is a branch of the verifying script."""
    img = sh(image)
    # the bytes relayed from docker save to the worker's docker load, every `every` seconds
    send = progress_command(f"ship {image} to the worker",
                            relay=(f"docker save {img}", _ssh(worker_ssh, "docker load")), total=total, every=every)
    fmt = sh(_IDENTITY_FORMAT)
    remote = _ssh(worker_ssh, sh("docker", "image", "inspect", "-f", _IDENTITY_FORMAT, image))
    mismatch = failing_shell("the image on the worker", f"after shipping, the worker's {image} still differs from "
                             "the head's; check the worker's free space under Docker's root and rerun the deploy")
    return [send.get_raw_value(), (
        f"h=$(docker image inspect -f {fmt} {img} 2>/dev/null); w=$({remote} 2>/dev/null); "
        f"if [ -n \"$w\" ] && {{ [ \"${{h%% *}}\" = \"${{w%% *}}\" ] || [ \"${{h#* }}\" = \"${{w#* }}\" ]; }}; "
        f"then echo \"sparkfold: the worker has {image}\"; else {mismatch}; fi"
    )]


# --- operations ---


def _built(image: str, image_hash: str) -> bool:
    have = fact_until_change(host, DockerImageInfo, image=image)
    return bool(have) and have["labels"].get(HASH_LABEL) == image_hash


@operation()
def engine_context_uploaded(image: str, image_hash: str, context_dir: str, files: list[str], build_dir: str):
    """`files` of `context_dir` uploaded to `build_dir`, a fresh folder per hash holding exactly the files hashed,
    unless `image` is built already (the tag exists carrying the same hash label)."""
    if _built(image, image_hash):
        host.noop(f"engine image {image} is already built: no build context needed")
        return
    dirs = sorted({build_dir} | {posixpath.join(build_dir, posixpath.dirname(f)) for f in files if "/" in f})
    yield f"rm -rf {sh(build_dir)} && mkdir -p {sh(*dirs)}"
    for rel in files:
        yield FileUploadCommand(str(Path(context_dir) / rel), posixpath.join(build_dir, rel))


@operation()
def engine_image_built(image: str, image_hash: str, build_args: dict, build_dir: str, every: int):
    """Build `image` (tag = content hash) on this host from the context in `build_dir` (engine_context_uploaded).
    Skipped when the tag exists carrying the same hash label. every: seconds between progress lines."""
    if _built(image, image_hash):
        host.noop(f"engine image {image} is already built")
        return
    yield build_command(image, image_hash, build_args, build_dir, every=every)


@operation()
def engine_image_shipped(image: str, worker_ssh: str, every: int):
    """Stream `image` from this host (the head) to the worker when the worker's copy is missing or differs, then
    check both hold the same image."""
    here = fact_until_change(host, DockerImageInfo, image=image)
    there = host.get_fact(PeerDockerImageInfo, target=worker_ssh, image=image)
    if same_image(here, there):
        host.noop(f"the worker already has {image} ({here['id'][:19]})")
        return
    missing = [] if here else [f"{image} is not on the head, so it cannot be shipped; the build step above should "
                               "have made it: rerun the deploy and read the build's output"]
    if (yield from check_failed("the image on the worker", missing, settled=False)):
        return
    yield from ship_commands(image, worker_ssh, here.get("size") or 0, every=every)


@operation()
def prebuilt_image_pulled(reference: str, every: int):
    """`reference` (name@sha256:digest) present, through docker.image: it pulls when `docker image inspect` of the
    digest finds nothing, and `docker pull` by digest verifies the content. Custom only to refuse an unpinned
    reference (docker.image would keep a stale tag) with the fix."""
    try:
        parse_prebuilt(reference)
    except ValueError as error:
        yield from check_failed("prebuilt_image", [str(error)])
        return
    for command in docker.image._inner(image=reference, present=True):
        # tens of GB: the newest layer's state while it pulls (docker prints one line per change without a terminal)
        if str(command).startswith("docker image pull"):
            command = progress_command(f"pull {reference}", str(command), latest=PULL_STEP, every=every)
        yield command


@operation()
def engine_capabilities_checked(image: str, cache_dir: str):
    """Read `tensorfold-native capabilities --json` from `image`, keep a document read whole from the image in
    cache_dir under the image's id (so later runs read that file, not a container), and fail this host when the
    launch could not trust it. While planning, an absent image is expected (an earlier step makes it)."""
    read = capabilities_read(image, cache_dir)
    caps = read["document"]
    keep = bool(cache_dir and read["image_id"] and caps and not read["cached"])
    if keep:
        yield capabilities_kept(cache_dir, read["image_id"], caps)
    problem = capabilities_problem(caps, image)
    if problem is None:
        if not keep:
            host.noop(f"{image}: engine {caps.get('version', '?')}, {len(caps['serve']['flags'])} serve flags")
        return
    yield from check_failed("the engine's capabilities", [problem], settled=False)


# --- deploy entry ---


@deploy("The engine image")
def engine_image(s: Settings) -> None:
    """The engine image made in the background (operations/streams): built on the head from its context and shipped
    to the worker as soon as it is built, or the prebuilt one pulled on both; awaited with the data
    (streams_finished), then checked (engine_image_checked). Docker commands run as the ssh user (group docker)."""
    ref, root = image_ref(s), s.layout.streams
    if s.prebuilt_image:
        background(Stream(IMAGE_STREAM, "build", f"pull {ref}", root), name=f"pull {ref}",
                   work=[(prebuilt_image_pulled, {"reference": s.prebuilt_image, "every": s.progress_every_s})])
    elif s.is_head:
        digest = computed_hash(s)
        build_dir = s.layout.build_dir(digest)
        engine_context_uploaded(name=f"build context of {ref} on the head", image=ref, image_hash=digest,
                                context_dir=str(s.engine_context_path),
                                files=content.context_files(s.engine_context_path), build_dir=build_dir)
        built = {"image": ref, "image_hash": digest, "build_args": content.build_args(s), "build_dir": build_dir,
                 "every": s.progress_every_s}
        build = background(Stream(IMAGE_STREAM, "build", f"build {ref}", root),
                           name=f"build {ref} on the head", work=[(engine_image_built, built)])
        shipped = {"image": ref, "worker_ssh": s.worker_link_ssh, "every": s.progress_every_s}
        background(Stream("image-to-worker", "to worker", f"ship {ref} to the worker", root, after=(IMAGE_STREAM,),
                          commands=tuple(ship_commands(ref, s.worker_link_ssh, every=s.progress_every_s))),
                   name=f"ship {ref} to the worker ({s.worker_link_ssh})", upstream=[build],
                   work=[(engine_image_shipped, shipped)])


@deploy("The engine image")
def engine_image_checked(s: Settings) -> None:
    """Once the background work is done: the engine's capabilities, read from the image and kept by its id."""
    ref = image_ref(s)
    engine_capabilities_checked(name=f"read the capabilities of {ref}", image=ref,
                                cache_dir=s.layout.capabilities_cache)
