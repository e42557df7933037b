"""Engine image facts and operations, both ways; the ship/pull checks' shell run against stub docker/ssh."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from harness import parse_fact, refused, run_op, unwrap_progress, with_args
from pyinfra.facts.docker import DockerImage
from settings_factory import make_settings

from operations import image
from operations.build.image_hash import context_files, image_hash
from operations.facts.docker import DockerImageInfo, EngineCapabilities, PeerDockerImageInfo, capabilities_cache_file
from operations.util.peer_ssh import ssh_prefix

FIXTURES = Path(__file__).parent / "fixtures" / "image"
TAG = "sparkfold/dsv41-tf:0123456789ab"
WORKER = "nvidia@192.168.100.2"
DIGEST = "sha256:5c3a6b1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b"
PREBUILT = f"ghcr.io/example/dsv41-tf@{DIGEST}"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def document(output: str) -> dict:
    """The capabilities document EngineCapabilities reads from `output`."""
    return parse_fact(EngineCapabilities, output)["document"]


BUILT = parse_fact(DockerImageInfo, fixture("inspect_built.json"))
CAPS = document(fixture("capabilities.txt"))
IMAGE_ID = "sha256:" + "7e" * 32
CAPS_DIR = "/home/nvidia/.local/state/sparkfold/capabilities"


def caps_read(doc: dict, cached: bool, image_id: str = IMAGE_ID) -> dict:
    """An EngineCapabilities answer: `doc` read from the cache file (cached) or from a container."""
    return {"image_id": image_id if doc else "", "document": doc, "cached": cached}


def images(**by_ref) -> dict:
    return with_args({f"image={ref}": value for ref, value in by_ref.items()})


def caps_of(**by_ref) -> dict:
    return with_args({f"cache_dir={CAPS_DIR}, image={ref}": value for ref, value in by_ref.items()})


# --- facts ---


def test_inspect_summary():
    assert BUILT["id"] == "sha256:4f1c2a9e0b7d6c5a3e2f1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a"
    assert BUILT["labels"]["sparkfold.image-hash"] == "0123456789ab"
    assert len(BUILT["layers"]) == 3 and BUILT["layers"][0].startswith("sha256:1a2b")
    assert BUILT["repo_tags"] == [TAG] and BUILT["size"] == 24871234567
    prebuilt = parse_fact(DockerImageInfo, fixture("inspect_prebuilt.json"))
    assert prebuilt["repo_digests"] == [PREBUILT]


@pytest.mark.parametrize("output", ["", "[]", "Error: No such image: x", "[{]"])
def test_inspect_absent_or_unreadable_is_empty(output):
    assert parse_fact(DockerImageInfo, output) == {}


def test_fact_commands_always_exit_zero_and_quote():
    local = DockerImageInfo().command(image="a b:1")
    assert local == "docker image inspect 'a b:1' 2>/dev/null || true"
    peer = PeerDockerImageInfo().command(target=WORKER, image=TAG)
    assert peer.startswith(ssh_prefix() + " ")
    assert f"{WORKER} 'docker image inspect {TAG}' 2>/dev/null || true" in peer
    caps = EngineCapabilities().command(image=TAG)
    assert f"docker run --rm --network none --entrypoint tensorfold-native {TAG} capabilities --json" in caps
    assert caps.startswith(f"id=$(docker image inspect -f '{{{{.Id}}}}' {TAG} 2>/dev/null) || exit 0; ")
    assert caps.endswith("2>/dev/null || true") and ".json" not in caps  # no cache_dir: no cache file read


@pytest.mark.parametrize("cache_dir", ["", CAPS_DIR])
def test_the_capabilities_fact_command_writes_nothing(cache_dir):
    command = EngineCapabilities().command(image=TAG, cache_dir=cache_dir)
    assert ">" not in re.sub(r"2>/dev/null", "", command)  # no redirection into a file
    assert not re.search(r"(?<![-\w])(mv|mkdir|cp|tee|touch|rm)\b", command)  # `docker run --rm` removes no file


def test_capabilities_parsed():
    assert CAPS["schema"] == 1 and CAPS["engine"] == "zig"
    assert CAPS["families"]["deepseek_v41"] == ["exl3-mul1"]
    flags = CAPS["serve"]["flags"]
    assert flags["--reasoning-effort"] == {"values": ["low", "medium", "high", "xhigh"]}
    assert flags["--host"] == {} and "--tp" not in flags
    assert "TENSORFOLD_NO_UPDATE_CHECK" in CAPS["env"]


def test_capabilities_say_where_they_were_read():
    body = fixture("capabilities.txt")
    cached = parse_fact(EngineCapabilities, f"#ID {IMAGE_ID}\n#CACHED\n{body}")
    assert cached == {"image_id": IMAGE_ID, "document": CAPS, "cached": True}
    fresh = parse_fact(EngineCapabilities, f"#ID {IMAGE_ID}\n#IMAGE\n{body}")
    assert fresh == {"image_id": IMAGE_ID, "document": CAPS, "cached": False}
    failed = parse_fact(EngineCapabilities, f"#ID {IMAGE_ID}\n#IMAGE\n")  # the image's engine printed nothing
    assert failed == {"image_id": IMAGE_ID, "document": {}, "cached": False}


def test_capabilities_after_other_output_and_pretty_printed():
    banner = document(fixture("capabilities_banner.txt"))
    assert banner["version"] == "1.0.2" and "deepseek_v41" not in banner["families"]
    pretty = document('#ID sha256:1\n#IMAGE\n{\n  "schema": 1,\n  "serve": {"flags": {"--port": {}}}\n}')
    assert pretty["serve"]["flags"] == {"--port": {}}


@pytest.mark.parametrize("output", ["", "tensorfold-native: not found", "[1, 2]"])
def test_capabilities_absent_is_empty(output):
    assert parse_fact(EngineCapabilities, output) == EngineCapabilities.default() == caps_read({}, False)


def test_capabilities_problems():
    assert image.capabilities_problem(CAPS, TAG) is None
    assert "could not read" in image.capabilities_problem({}, TAG)
    assert "schema 2" in image.capabilities_problem(dict(CAPS, schema=2), TAG)
    assert "no serve flags" in image.capabilities_problem(dict(CAPS, serve={"flags": {}}), TAG)
    banner = document(fixture("capabilities_banner.txt"))
    assert "deepseek_v41" in image.capabilities_problem(banner, TAG)


# --- pure helpers ---


def test_parse_prebuilt():
    assert image.parse_prebuilt(PREBUILT) == ("ghcr.io/example/dsv41-tf", DIGEST)
    for bad in ("ghcr.io/example/dsv41-tf:latest", "x@sha256:abc", f"x@{DIGEST}extra", "@" + DIGEST):
        with pytest.raises(ValueError, match="prebuilt_image"):
            image.parse_prebuilt(bad)


def test_same_image():
    other_store = dict(BUILT, id="sha256:" + "e" * 64)  # same content, another image store's id
    assert image.same_image(BUILT, dict(BUILT))
    assert image.same_image(BUILT, other_store)
    assert not image.same_image(BUILT, dict(other_store, layers=BUILT["layers"][:2]))
    assert not image.same_image(BUILT, dict(other_store, labels={"sparkfold.image-hash": "fffffffffff0"}))
    assert not image.same_image(BUILT, {}) and not image.same_image({}, {})


def settings(tmp_path: Path, is_head: bool = True, **over):
    """Real Settings whose build context is a small one in tmp_path."""
    ctx = tmp_path / "zig"
    (ctx / "patches").mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text("FROM base\n")
    (ctx / "patches" / "0001-a.patch").write_text("diff --git a/a b/a\n")
    values = dict(engine_context=str(ctx), base_image="nvcr.io/nvidia/pytorch:26.07-py3", zig_version="0.17.0",
                  zig_url="https://z/zig.tar.xz", zig_sha256="9e" * 32, tools_ref="5940208")
    values.update(over)
    return make_settings("head" if is_head else "worker", **values)


def test_image_ref(tmp_path):
    s = settings(tmp_path)
    ref = image.image_ref(s)
    name, _, tag = ref.partition(":")
    assert name == "sparkfold/dsv41-tf" and tag == image.computed_hash(s) and len(tag) == 12
    (Path(s.engine_context_path) / "patches" / "0001-a.patch").write_text("diff --git a/a b/a\n+x\n")
    assert image.image_ref(s) != ref
    assert image.image_ref(settings(tmp_path, prebuilt_image=PREBUILT)) == PREBUILT


# --- engine_context_uploaded, engine_image_built ---

BUILD_DIR = "/home/nvidia/.cache/sparkfold/build/0123456789ab"
BUILD_ARGS = {"TF_REF": "fbbc971", "BASE_IMAGE": "nvcr.io/nvidia/pytorch:26.07-py3"}


def build(facts, **over):
    kwargs = dict(image=TAG, image_hash="0123456789ab", build_args=BUILD_ARGS, build_dir=BUILD_DIR, every=10)
    kwargs.update(over)
    return run_op(image.engine_image_built, {DockerImageInfo: facts}, **kwargs)


def context(facts):
    return run_op(image.engine_context_uploaded, {DockerImageInfo: facts}, image=TAG, image_hash="0123456789ab",
                  context_dir="/ctl/zig", files=["Dockerfile", "apply-patches.sh", "patches/0001-a.patch"],
                  build_dir=BUILD_DIR)


def test_build_skipped_when_the_tag_exists():
    commands, host = build(images(**{TAG: BUILT}))
    assert commands == []
    assert host.noops == [f"engine image {TAG} is already built"]
    commands, host = context(images(**{TAG: BUILT}))
    assert commands == [] and host.noops == [f"engine image {TAG} is already built: no build context needed"]


@pytest.mark.parametrize("have", [{}, dict(BUILT, labels={"sparkfold.image-hash": "ffffffffffff"})],
                         ids=["missing", "other-hash-label"])
def test_build_uploads_the_context_and_builds(have):
    uploads, _ = context(images(**{TAG: have}))
    d = BUILD_DIR
    assert uploads == [
        f"rm -rf {d} && mkdir -p {d} {d}/patches",
        f"FileUploadCommand(/ctl/zig/Dockerfile, {d}/Dockerfile)",
        f"FileUploadCommand(/ctl/zig/apply-patches.sh, {d}/apply-patches.sh)",
        f"FileUploadCommand(/ctl/zig/patches/0001-a.patch, {d}/patches/0001-a.patch)",
    ]
    commands, _ = build(images(**{TAG: have}))
    assert len(commands) == 1  # the build alone: it runs in the background, the uploads before it
    label, docker_build, options = unwrap_progress(commands[0])  # the build shows its newest step while it runs
    assert docker_build == (
        "docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:26.07-py3 --build-arg IMAGE_HASH=0123456789ab"
        f" --build-arg TF_REF=fbbc971 --label sparkfold.image-hash=0123456789ab -t {TAG} {d}"
    )
    assert label == f"build {TAG}" and "--latest" in options


# --- engine_image_shipped ---


def ship(here, there, executing=False):
    facts = {DockerImageInfo: images(**{TAG: here}),
             PeerDockerImageInfo: with_args({f"image={TAG}, target={WORKER}": there})}
    return run_op(image.engine_image_shipped, facts, executing=executing, image=TAG, worker_ssh=WORKER, every=10)


def test_ship_skipped_when_the_worker_has_the_same_image():
    commands, host = ship(BUILT, dict(BUILT))
    assert commands == [] and host.noops[0].startswith(f"the worker already has {TAG}")
    other_store = dict(BUILT, id="sha256:" + "e" * 64)
    assert ship(BUILT, other_store)[0] == []


@pytest.mark.parametrize("there", [{}, dict(BUILT, id="sha256:" + "d" * 64, layers=["sha256:" + "0" * 64])],
                         ids=["worker-missing", "worker-differs"])
def test_ship_streams_and_verifies(there):
    commands, _ = ship(BUILT, there, executing=True)
    assert len(commands) == 2
    send, verify = commands
    label, _, options = unwrap_progress(send)  # relayed by the progress runner, which counts the bytes
    source, sink = options[options.index("--relay") + 1:options.index("--relay") + 3]
    assert source == f"docker save {TAG}" and sink.startswith(ssh_prefix() + " ")
    assert sink.endswith(f"{WORKER} 'docker load'") and label == f"ship {TAG} to the worker"
    assert "docker image inspect -f" in verify and WORKER in verify and "exit 1" in verify


def test_ship_planned_before_the_head_has_built():
    commands, _ = ship({}, {}, executing=False)
    assert len(commands) == 2 and "docker save" in commands[0]


def test_ship_fails_when_the_head_image_is_missing_at_execute():
    commands, _ = ship({}, {}, executing=True)
    assert len(commands) == 1
    assert commands[0].startswith("echo 'sparkfold: the image on the worker: " + TAG + " is not on the head")
    assert commands[0].endswith("exit 1")


# --- prebuilt_image_pulled ---


def pull(present, reference=PREBUILT, executing=False):
    """docker.image reads `docker image inspect <name@digest>`: [] when no local image carries that digest."""
    inspect = [{"Id": "sha256:111", "RepoDigests": [PREBUILT]}] if present else []
    return run_op(image.prebuilt_image_pulled, {DockerImage: with_args({f"object_id={reference}": inspect})},
                  executing=executing, reference=reference, every=10)


def test_prebuilt_present_with_its_digest_is_left_alone():
    commands, host = pull(True)
    assert commands == [] and host.noops == [f"Image with digest {DIGEST} already exists!"]


def test_prebuilt_pulled_by_its_digest_when_missing():
    commands, _ = pull(False)  # also when the name is present with another digest: inspect by digest is empty
    assert len(commands) == 1
    label, pulling, options = unwrap_progress(commands[0])  # tens of GB: the newest layer state every 10 s
    assert pulling == f"docker image pull {PREBUILT}"  # pulling by digest makes docker verify the content
    assert label == f"pull {PREBUILT}" and options[options.index("--latest") + 1] == image.PULL_STEP


def test_prebuilt_malformed_reference_fails(caplog):
    command, warnings = refused(caplog, image.prebuilt_image_pulled, {}, reference="ghcr.io/example/dsv41-tf:latest",
                                every=10)
    assert command.startswith("echo 'sparkfold: prebuilt_image: prebuilt_image ") and "imagetools inspect" in command
    assert "will fail: prebuilt_image: prebuilt_image 'ghcr.io/example/dsv41-tf:latest' is not name@sha256:<64 hex>" \
        in warnings


# --- engine_capabilities_checked ---


def check(read, executing, cache_dir=CAPS_DIR):
    return run_op(image.engine_capabilities_checked,
                  {EngineCapabilities: with_args({f"cache_dir={cache_dir}, image={TAG}": read})},
                  executing=executing, image=TAG, cache_dir=cache_dir)


@pytest.mark.parametrize("executing", [False, True])
def test_capabilities_kept_and_good_change_nothing(executing):
    commands, host = check(caps_read(CAPS, cached=True), executing)
    assert commands == [] and host.noops == [f"{TAG}: engine 1.0.2, 17 serve flags"]


@pytest.mark.parametrize("executing", [False, True])
def test_capabilities_read_from_the_image_are_kept_by_its_id(executing):
    commands, host = check(caps_read(CAPS, cached=False), executing)
    path = f"{CAPS_DIR}/{'7e' * 32}.json"
    assert commands == [f"mkdir -p {CAPS_DIR} && printf '%s\\n' '{json.dumps(CAPS)}' > {path}.$$ "
                        f"&& mv -f {path}.$$ {path}"]
    assert host.noops == []  # the operation changes the Spark: the file is written


def test_capabilities_absent_tolerated_while_planning_enforced_when_executing():
    assert check(caps_read({}, False), executing=False)[0] == []
    commands, _ = check(caps_read({}, False), executing=True)  # nothing read whole: nothing kept
    assert len(commands) == 1 and "could not read `tensorfold-native capabilities --json`" in commands[0]


def test_capabilities_wrong_family_fails():
    banner = document(fixture("capabilities_banner.txt"))
    commands, _ = check(caps_read(banner, cached=True), executing=True)
    assert len(commands) == 1 and "does not load deepseek_v41 checkpoints in exl3-mul1" in commands[0]


def test_no_cache_dir_keeps_nothing():
    commands, host = check(caps_read(CAPS, cached=False), executing=True, cache_dir="")
    assert commands == [] and host.noops


def test_read_capabilities_uses_the_fact():
    from pyinfra.api import operation

    from operations.image import read_capabilities

    @operation()
    def probe(ref):
        yield str(read_capabilities(ref, CAPS_DIR)["schema"])

    facts = {EngineCapabilities: with_args({f"cache_dir={CAPS_DIR}, image={TAG}": caps_read(CAPS, True)})}
    commands, host = run_op(probe, facts, ref=TAG)
    assert commands == ["1"]
    assert host.fact_calls == [("operations.facts.docker.EngineCapabilities", {"image": TAG, "cache_dir": CAPS_DIR})]


def test_the_cache_file_is_named_by_the_image_id():
    assert capabilities_cache_file(CAPS_DIR, "sha256:abc") == f"{CAPS_DIR}/abc.json"


def _image_store(tmp_path, monkeypatch):
    """A stand-in docker: `image inspect -f {{.Id}}` prints tmp/id (fails without it), `run` prints a document
    naming that id; every call is logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(f"#!/bin/sh\necho \"$1\" >> {tmp_path}/calls\nid=$(cat {tmp_path}/id 2>/dev/null) || exit 1\n"
                    "case $1 in image) echo \"$id\";; run) [ -e "
                    f"{tmp_path}/broken ] || echo \"{{\\\"schema\\\": 1, \\\"id\\\": \\\"$id\\\"}}\";; esac\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lambda: (tmp_path / "calls").read_text().split().count("run") if (tmp_path / "calls").exists() else 0


def _checked_for_real(cache: str) -> dict:
    """engine_capabilities_checked against the stand-in docker: its fact run in a local shell, then its commands
    (the stand-in's document lists no serve flags, so the check's own failure follows any write)."""
    from harness import run_fact
    read = run_fact(EngineCapabilities, image=TAG, cache_dir=cache)
    commands, _ = check(read, executing=True, cache_dir=cache)
    for command in commands:
        subprocess.run(["sh", "-c", command], capture_output=True)
    return read


def test_capabilities_are_read_from_the_image_once_per_image_id(tmp_path, monkeypatch):
    from harness import run_fact
    runs = _image_store(tmp_path, monkeypatch)
    cache = tmp_path / "state" / "capabilities"
    assert run_fact(EngineCapabilities, image=TAG, cache_dir=str(cache)) == caps_read({}, False)
    assert runs() == 0  # no image: no container
    (tmp_path / "id").write_text("sha256:aaa\n")
    fresh = caps_read({"schema": 1, "id": "sha256:aaa"}, cached=False, image_id="sha256:aaa")
    assert run_fact(EngineCapabilities, image=TAG, cache_dir=str(cache)) == fresh
    assert runs() == 1 and not cache.exists()  # the fact reads only, also under --dry and in status.py
    assert _checked_for_real(str(cache)) == fresh and runs() == 2  # the operation keeps what it read
    assert (cache / "aaa.json").read_text() == '{"schema": 1, "id": "sha256:aaa"}\n'  # one JSON line
    assert os.listdir(cache) == ["aaa.json"]  # nothing left aside
    assert _checked_for_real(str(cache)) == dict(fresh, cached=True) and runs() == 2  # kept: no container
    (tmp_path / "id").write_text("sha256:bbb\n")  # rebuilt under the same tag: read afresh
    rebuilt = run_fact(EngineCapabilities, image=TAG, cache_dir=str(cache))
    assert rebuilt["document"] == {"schema": 1, "id": "sha256:bbb"} and not rebuilt["cached"] and runs() == 3


def test_a_cache_file_that_is_not_whole_is_read_again_and_replaced(tmp_path, monkeypatch):
    runs = _image_store(tmp_path, monkeypatch)
    cache = tmp_path / "capabilities"
    cache.mkdir()
    (cache / "ddd.json").write_text('{"schema": 1, "id"')  # cut short
    (tmp_path / "id").write_text("sha256:ddd\n")
    assert _checked_for_real(str(cache))["cached"] is False and runs() == 1
    assert json.loads((cache / "ddd.json").read_text()) == {"schema": 1, "id": "sha256:ddd"}


def test_a_capabilities_read_that_fails_is_not_kept(tmp_path, monkeypatch):
    runs = _image_store(tmp_path, monkeypatch)
    cache = tmp_path / "capabilities"
    (tmp_path / "id").write_text("sha256:ccc\n")
    (tmp_path / "broken").write_text("")
    assert _checked_for_real(str(cache))["document"] == {}
    assert _checked_for_real(str(cache))["document"] == {}
    assert runs() == 2 and not cache.exists()


# --- the step: background streams, then the check ---


@pytest.fixture
def calls(monkeypatch):
    seen = []
    for op in ("engine_context_uploaded", "engine_capabilities_checked"):
        monkeypatch.setattr(image, op, lambda _op=op, **kw: seen.append((_op, kw)))

    def background(stream, name, upstream=(), work=()):
        seen.append(("background", {"stream": stream, "name": name, "upstream": list(upstream), "work": list(work)}))
        return stream.name  # stands in for the operation's meta: what the streams that read it name

    monkeypatch.setattr(image, "background", background)
    return seen


def test_deploy_head_uploads_then_builds_and_ships_in_the_background(tmp_path, calls):
    s = settings(tmp_path)
    image.engine_image._inner(s)
    ref = image.image_ref(s)
    digest = ref.rpartition(":")[2]
    assert [c[0] for c in calls] == ["engine_context_uploaded", "background", "background"]
    uploaded = calls[0][1]
    assert uploaded["image"] == ref and uploaded["image_hash"] == digest
    assert uploaded["build_dir"] == f"/home/nvidia/.cache/sparkfold/build/{digest}"
    assert uploaded["files"] == context_files(s.engine_context_path) == ["Dockerfile", "patches/0001-a.patch"]
    build, ship = calls[1][1], calls[2][1]
    assert build["stream"].name == "image" and build["stream"].lane == "build" and build["upstream"] == []
    op, built = build["work"][0]
    assert op is image.engine_image_built and built["build_args"]["TF_REF"] == "fbbc971"
    assert "IMAGE_HASH" not in built["build_args"] and image_hash(s.engine_context_path, built["build_args"]) == digest
    assert build["name"] == f"build {ref} on the head"  # the names the operations had before they streamed
    # the ship waits for the build, starts with it, and is the ship operation's work otherwise
    assert ship["stream"].after == ("image",) and ship["upstream"] == ["image"]
    assert ship["work"] == [(image.engine_image_shipped, {"image": ref, "worker_ssh": WORKER, "every": 10})]
    assert ship["stream"].commands == tuple(image.ship_commands(ref, WORKER, every=10))
    assert ship["name"] == f"ship {ref} to the worker ({WORKER})"


def test_deploy_worker_builds_nothing(tmp_path, calls):
    image.engine_image._inner(settings(tmp_path, is_head=False))
    assert calls == []
    image.engine_image_checked._inner(settings(tmp_path, is_head=False))
    assert [c[0] for c in calls] == ["engine_capabilities_checked"]


@pytest.mark.parametrize("is_head", [True, False])
def test_deploy_prebuilt_pulls_on_both_in_the_background(tmp_path, calls, is_head):
    s = settings(tmp_path, is_head=is_head, prebuilt_image=PREBUILT)
    image.engine_image._inner(s)
    image.engine_image_checked._inner(s)
    assert [c[0] for c in calls] == ["background", "engine_capabilities_checked"]
    assert calls[0][1]["stream"].name == "image"
    assert calls[0][1]["work"] == [(image.prebuilt_image_pulled, {"reference": PREBUILT, "every": 10})]
    assert calls[1][1]["image"] == PREBUILT


def every_of(command: str) -> str:
    """The seconds between the progress lines of a progress_command wrapper."""
    options = unwrap_progress(command)[2]
    return options[options.index("--every") + 1]


def test_progress_every_s_reaches_the_build_the_ship_and_the_pull(tmp_path, calls):
    s = settings(tmp_path, progress_every_s=2)
    image.engine_image._inner(s)
    ref = image.image_ref(s)
    (_, built), = calls[1][1]["work"]
    (_, shipped), ship_stream = calls[2][1]["work"][0], calls[2][1]["stream"]
    assert every_of(run_op(image.engine_image_built, {DockerImageInfo: images(**{ref: {}})}, **built)[0][0]) == "2"
    assert every_of(ship_stream.commands[0]) == "2"  # the stream's own commands, a fresh start's
    facts = {DockerImageInfo: images(**{ref: BUILT}),
             PeerDockerImageInfo: with_args({f"image={ref}, target={WORKER}": {}})}
    assert every_of(run_op(image.engine_image_shipped, facts, executing=True, **shipped)[0][0]) == "2"
    calls.clear()
    image.engine_image._inner(settings(tmp_path, prebuilt_image=PREBUILT, progress_every_s=2))
    (_, pulled), = calls[0][1]["work"]
    facts = {DockerImage: with_args({f"object_id={PREBUILT}": []})}
    assert every_of(run_op(image.prebuilt_image_pulled, facts, **pulled)[0][0]) == "2"


# --- the generated shell, against stub docker and ssh ---

STUB_DOCKER = """#!/bin/sh
# Prints the identity of the image on this side ($SIDE); `pull` and `load` just succeed.
case "$1 $2" in
  "image inspect") eval "printf '%s\\n' \\"\\$${SIDE:-HEAD}_IMAGE\\"" ;;
  *) exit 0 ;;
esac
"""
STUB_SSH = """#!/bin/sh
# Drops the options and the target, then runs the remote command here as the worker.
while [ "$1" = "-o" ]; do shift 2; done
shift
SIDE=WORKER sh -c "$*"
"""


def run_with_stubs(tmp_path: Path, command: str, head: str, worker: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("docker", STUB_DOCKER), ("ssh", STUB_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HEAD_IMAGE": head, "WORKER_IMAGE": worker}
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env)


LAYERS = '["sha256:aa","sha256:bb"]{"sparkfold.image-hash":"0123456789ab"}'


@pytest.mark.parametrize("worker, ok", [
    (f"sha256:111 {LAYERS}", True),  # same id
    (f"sha256:999 {LAYERS}", True),  # other image store, same layers and labels
    ('sha256:999 ["sha256:aa"]{"sparkfold.image-hash":"0123456789ab"}', False),
    ("", False),  # the load did not happen
])
def test_ship_verification_shell(tmp_path, worker, ok):
    verify = ship(BUILT, {}, executing=True)[0][1]
    result = run_with_stubs(tmp_path, verify, head=f"sha256:111 {LAYERS}", worker=worker)
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert "still differs from the head's" in result.stderr
