"""An interrupted download resumes without fetching again what it had: the checkpoint is downloaded anew through a
slowed fake hub, the run is killed part-way (as a user would, with ^C or a lost terminal), and the next run fetches
only the files the first did not finish, measured in the fake hub's own log, and says how much was already there.

Files this small arrive whole or not at all (huggingface_hub writes a file in 10 MB chunks), so "what it had" is
counted in whole files here; a cut inside one file resuming by range is shown in tests/unit/test_fakehub.py.
The killed run's download goes on (a systemd unit of the Spark's, issue 26) until the head loses power: the unit is
gone with the boot, and the next run starts the download again, fetching none of the whole files. (stop.py stopping
a stream is in test_long_steps.py.) Starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import re

import pytest
from test_deploy import chat, deploy_killed_at, start_deploy
from test_overlap import slow_hub  # the fake hub at 1 KiB/s: the checkpoint takes about a minute
from test_reboot import rebooted

REPO = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"  # model_repo's default: the checkpoint
FOLDER = "/home/nvidia/.cache/huggingface/hub/models--" + REPO.replace("/", "--")
HUB_LOG = "/var/log/fakehub.log"
STEP = "Checkpoint download:"
FETCHED = re.compile(re.escape(STEP) + r" .*, (\d+) of \d+ files whole")  # hf_fetch's count, on the runner's line
SERVED = re.compile(r" GET /" + re.escape(REPO) + r"/resolve/\w+/(\S+) (\d{3}) (\d+)")

pytestmark = pytest.mark.usefixtures("converged_pair")


def hub_lines(sim_exec) -> int:
    return int(sim_exec("head", f"wc -l < {HUB_LOG}").stdout)


def served_since(sim_exec, line: int) -> list[tuple[str, int, int]]:
    """(file, status, bytes sent) of each checkpoint file the fake hub served after log line `line`."""
    text = sim_exec("head", f"tail -n +{line + 1} {HUB_LOG}").stdout
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in SERVED.finditer(text)]


def file_sizes(sim_exec) -> dict[str, int]:
    """The checkpoint's complete files on the head (a file gets its snapshot link once it is whole)."""
    snap = sim_exec("head", f"cd {FOLDER}/snapshots/* 2>/dev/null && find -L . -type f -printf '%P %s\\n'").stdout
    return {name: int(size) for name, size in (line.split() for line in snap.splitlines())}


def some_files_whole(line: str) -> bool:
    """A download line that counts whole files (bytes alone may all be in unfinished files)."""
    got = FETCHED.search(line)
    return bool(got) and int(got.group(1)) > 0


def test_an_interrupted_download_resumes_without_fetching_again_what_it_had(site_file, sim_exec, sim):
    sizes = {name: size for name, size in file_sizes(sim_exec).items() if name != ".sparkfold-complete.json"}
    assert sim_exec("head", f"rm -rf {FOLDER}").returncode == 0  # the checkpoint must be fetched again
    slow_hub(sim_exec, True)
    try:
        # 1. a run killed once the download has run a while: some files whole (8 files share 1 KiB/s)
        mark1 = hub_lines(sim_exec)
        seen = deploy_killed_at(site_file, some_files_whole, 480)
        assert any(STEP in text for text in seen), "\n".join(seen[-40:])
        # the download goes on without the run (a unit of the Spark's: the next run would follow it), until the
        # head loses power: nothing stopped in order, the unit and its processes gone with the boot
        assert sim_exec("head", ["systemctl", "is-active", "sparkfold-checkpoint"]).stdout.strip() == "active"
        assert served_since(sim_exec, mark1), "the first run fetched nothing"
        rebooted(sim, sim_exec, "head", hard=True)
        gone = sim_exec("head", ["systemctl", "show", "sparkfold-checkpoint", "-p", "LoadState", "--value"])
        assert gone.stdout.strip() == "not-found", gone.stdout
        assert sim_exec("head", f"pgrep -f -- '--repo {REPO}'").returncode != 0, "the download outlived the boot"
    finally:
        slow_hub(sim_exec, False)  # the boot started the hub at its own pace; this is for a failure before
    # what it had: the files that arrived whole (the hub's log cannot say: a small file leaves its socket at once)
    had = {name for name, size in file_sizes(sim_exec).items() if sizes.get(name) == size}
    # part of the checkpoint, not all of it
    assert had and had != set(sizes), (had, sorted(sizes), seen[-5:], sim_exec("head", f"find {FOLDER}").stdout)

    # 2. the next run fetches only the rest, and its first line says what was already there
    mark2 = hub_lines(sim_exec)
    run = start_deploy(site_file)
    assert run.stderr is not None
    lines = [line.rstrip("\n") for line in run.stderr]
    assert run.wait() == 0, "\n".join(lines[-60:])
    second = served_since(sim_exec, mark2)
    fetched = {name for name, _status, _sent in second}
    assert fetched and not fetched & had, (fetched, had)
    assert sum(sent for _n, _s, sent in second) <= sum(sizes.values()) - sum(sizes[n] for n in had)
    mine = [text for text in lines if STEP in text]
    assert mine and "already there" in mine[0] and "KiB" in mine[0], mine
    assert {n: file_sizes(sim_exec)[n] for n in sizes} == sizes
    assert chat()["choices"][0]["message"]["content"]

