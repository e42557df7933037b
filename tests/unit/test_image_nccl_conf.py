"""The engine image's /etc/nccl.conf, kept by image id: ImageNcclConf reads the kept answer when it is whole and
starts a container otherwise; link_measure keeps what a container read (its plan's operations are the scenarios
under tests/operations/link_measure.link_measured)."""

from __future__ import annotations

import os
import subprocess

import pytest
from harness import FakeHost, _render, parse_fact, run_fact

from operations.facts.network import NCCL_CONF_MARK, NCCL_CONF_NONE, ImageNcclConf, nccl_conf_cache_file
from operations.link_measure import _nccl_conf_checked, nccl_conf_kept

IMAGE = "sparkfold/dsv41-tf:abc"
STALE = "NCCL_IB_HCA=mlx5_0"


def read(text, cached, image_id="sha256:aaa", whole=True):
    return {"image_id": image_id, "text": text, "cached": cached, "whole": whole}


@pytest.fixture
def image(tmp_path, monkeypatch):
    """A stand-in docker on the PATH: `image inspect -f {{.Id}}` prints tmp/id (fails without it, as for a missing
    image); `run ... sh -c SCRIPT` runs the fact's own script with tmp/nccl.conf as the image's /etc/nccl.conf
    (fails with tmp/broken). Returns how many containers were started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(f"#!/bin/sh\necho \"$1\" >> {tmp_path}/calls\n"
                    "case $1 in\n"
                    f"  image) cat {tmp_path}/id 2>/dev/null || {{ echo 'No such image' >&2; exit 1; }};;\n"
                    f"  run) [ -e {tmp_path}/broken ] && exit 125\n"
                    "       for script; do :; done\n"  # the last word: the script
                    f"       exec sh -c \"$(printf '%s' \"$script\" | sed 's#/etc/#{tmp_path}/#g')\";;\n"
                    "esac\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "id").write_text("sha256:aaa\n")
    return lambda: (tmp_path / "calls").read_text().split().count("run") if (tmp_path / "calls").exists() else 0


def keep(cache: str, found: dict) -> None:
    """The operation's keep command run in a local shell, as a Spark runs it."""
    command = nccl_conf_kept(cache, found)
    assert command is not None
    subprocess.run(["sh", "-c", command], check=True)


# --- the fact ---


def test_process_tells_no_file_from_an_empty_one_and_from_text():
    image = ["#ID sha256:aaa", "#IMAGE"]
    assert parse_fact(ImageNcclConf, [*image, NCCL_CONF_NONE]) == read(None, False)
    assert parse_fact(ImageNcclConf, [*image, "", NCCL_CONF_MARK]) == read("", False)
    assert parse_fact(ImageNcclConf, [*image, STALE, "", NCCL_CONF_MARK]) == read(STALE, False)
    assert parse_fact(ImageNcclConf, ["#ID sha256:aaa", "#CACHED", STALE, "", NCCL_CONF_MARK]) == read(STALE, True)
    # an answer cut short is not whole: judged as no file (as before), never kept
    assert parse_fact(ImageNcclConf, [*image, STALE]) == read(None, False, whole=False)


def test_the_command_reads_the_kept_file_before_starting_a_container():
    command = ImageNcclConf().command(IMAGE, "/state/nccl-conf")
    assert command.index("docker image inspect -f '{{.Id}}'") < command.index('"${id#*:}".txt') \
        < command.index("docker run --rm --network none --entrypoint sh")
    assert "'#CACHED'" in command and "|| true" not in command  # docker failing fails the fact
    assert "/state/nccl-conf" not in ImageNcclConf().command(IMAGE) and "docker run" in ImageNcclConf().command(IMAGE)


@pytest.mark.parametrize("content", [None, "", STALE, f"# a comment\n{STALE}\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n\n"])
def test_an_answer_read_from_the_image_once_is_kept_and_read_back_without_a_container(tmp_path, image, content):
    if content is not None:
        (tmp_path / "nccl.conf").write_text(content)
    cache = str(tmp_path / "state" / "nccl-conf")
    fresh = run_fact(ImageNcclConf, image=IMAGE, cache_dir=cache)
    assert fresh == read(None if content is None else content.rstrip(), False) and image() == 1
    assert not os.path.exists(cache)  # the fact only reads: it runs under --dry too
    keep(cache, fresh)
    assert os.listdir(cache) == ["aaa.txt"]  # nothing left aside
    assert run_fact(ImageNcclConf, image=IMAGE, cache_dir=cache) == dict(fresh, cached=True)
    assert image() == 1  # converged: no container started


@pytest.mark.parametrize("kept", ["", f"{STALE}\n\n#sparkfold: nccl.conf pre", f"{STALE}\n", "#sparkfold: no nccl"])
def test_a_kept_file_that_is_not_whole_reads_the_image(tmp_path, image, kept):
    (tmp_path / "nccl.conf").write_text(f"{STALE}\n")
    cache = tmp_path / "nccl-conf"
    cache.mkdir()
    (cache / "aaa.txt").write_text(kept)
    assert run_fact(ImageNcclConf, image=IMAGE, cache_dir=str(cache)) == read(STALE, False) and image() == 1


def test_a_new_image_id_is_read_from_the_image(tmp_path, image):
    cache = str(tmp_path / "nccl-conf")
    keep(cache, read(None, False))  # the old image had none
    (tmp_path / "id").write_text("sha256:bbb\n")  # rebuilt under the same tag, now with a stale file
    (tmp_path / "nccl.conf").write_text(STALE)
    assert run_fact(ImageNcclConf, image=IMAGE, cache_dir=cache) == read(STALE, False, image_id="sha256:bbb")
    assert image() == 1


@pytest.mark.parametrize("fault", ["no image", "docker run fails"])
def test_a_missing_image_or_failing_docker_fails_the_fact_kept_answer_or_not(tmp_path, image, fault):
    cache = str(tmp_path / "nccl-conf")
    if fault == "no image":
        keep(cache, read(None, False))
        (tmp_path / "id").unlink()
    else:
        (tmp_path / "broken").write_text("")
    done = subprocess.run(["sh", "-c", ImageNcclConf().command(IMAGE, cache)], capture_output=True, text=True)
    assert done.returncode != 0, done.stdout
    assert image() == (0 if fault == "no image" else 1)


def test_the_cache_file_is_named_by_the_image_id():
    assert nccl_conf_cache_file("/s/nccl-conf", "sha256:abc") == "/s/nccl-conf/abc.txt"


# --- kept by the operation ---


def test_only_an_answer_read_whole_from_the_image_is_kept():
    assert nccl_conf_kept("/s/nccl-conf", read(STALE, False)) is not None
    assert nccl_conf_kept("/s/nccl-conf", read(STALE, True)) is None  # read from the cache already
    assert nccl_conf_kept("/s/nccl-conf", read(None, False, whole=False)) is None
    assert nccl_conf_kept("", read(STALE, False)) is None


class ShellHost(FakeHost):
    """A host whose shell commands are recorded and answered `ok`."""

    def __init__(self, facts: dict, ok: bool = True):
        super().__init__(facts)
        self.ok, self.ran = ok, []

    def run_shell_command(self, command, **_kwargs):
        self.ran.append(_render(command))
        return self.ok, None


def checked(found: dict, mode: str = "stop", ok: bool = True) -> tuple[bool, ShellHost]:
    """_nccl_conf_checked (the image was built in this run) on a host whose ImageNcclConf answers `found`."""
    from pyinfra.context import ctx_host

    host = ShellHost({ImageNcclConf: {"__args__": {f"cache_dir=/s/nccl-conf, image={IMAGE}": found}}}, ok)
    with ctx_host.use(host):
        return _nccl_conf_checked(None, host, IMAGE, "/s/nccl-conf", mode), host


def test_a_new_image_read_while_executing_is_kept_and_judged(caplog):
    passed, host = checked(read(None, False))
    assert passed and host.ran == [nccl_conf_kept("/s/nccl-conf", read(None, False))]
    with caplog.at_level("ERROR", logger="pyinfra"):
        passed, host = checked(read(STALE, False))
    assert not passed and host.ran == [nccl_conf_kept("/s/nccl-conf", read(STALE, False))]  # kept, then stops
    assert "the engine image carries /etc/nccl.conf" in caplog.text


def test_a_kept_answer_read_while_executing_writes_nothing():
    passed, host = checked(read(None, True))
    assert passed and host.ran == []


def test_a_keep_that_fails_is_a_warning_not_a_stop(caplog):
    with caplog.at_level("WARNING", logger="pyinfra"):
        passed, host = checked(read(None, False), ok=False)
    assert passed and len(host.ran) == 1
    assert "could not be kept in /s/nccl-conf" in caplog.text
