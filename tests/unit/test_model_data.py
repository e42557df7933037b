"""Facts (run for real against tmp folders where they are local) and the model-data operations, both ways."""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from harness import _kwargs_key, parse_fact, refused, run_fact, run_op, unwrap_progress, with_args
from hf_fixture import build_cache, model_files
from pyinfra.facts.files import Sha256File
from settings_factory import make_settings

from operations import model_data
from operations.data import copy as data_copy
from operations.data.copy import listing_digest
from operations.data.hub import hub_change, hub_env_name, hub_env_text, token_name
from operations.facts.files import (
    DirFiles,
    DiskFree,
    FileText,
    FolderCheck,
    LinkTarget,
    PeerFolder,
    first_line,
)
from operations.facts.model import AblitShards, HfHubPython, HfPlan, RankFolder
from operations.rank.plan import served_model_path
from operations.util.peer_ssh import ssh_prefix

COMMIT = "a" * 40


def run_local(fact_cls, **kwargs):
    """Run a fact's command in a local shell and parse it as pyinfra would (empty output -> default)."""
    return run_fact(fact_cls, **kwargs)


def table(*entries):
    return with_args({_kwargs_key(k): v for k, v in entries})


def complete_plan(**extra):
    return dict({"complete": True, "manifest": True, "commit": COMMIT, "missing": [], "missing_bytes": 0,
                 "total_bytes": 200, "model_type": "deepseek_v41", "error": None, "offline": True}, **extra)


# ---- facts ----

def test_dir_files_lists_sizes_and_mtimes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"12345")
    os.utime(tmp_path / "sub" / "a.bin", (1700000000, 1700000000))
    assert run_local(DirFiles, path=str(tmp_path)) == {"sub/a.bin": [5, 1700000000]}
    assert run_local(DirFiles, path=str(tmp_path / "absent")) == {}


def test_folder_check_reads_sums_names_and_marker(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"abc")
    subprocess.run("sha256sum x.bin > SHA256SUMS", shell=True, cwd=tmp_path, check=True)
    (tmp_path / ".sparkfold-verified").write_text("deadbeef\n")
    got = run_local(FolderCheck, path=str(tmp_path), sums="SHA256SUMS", marker=".sparkfold-verified")
    assert got["names"] == ["x.bin"] and got["marker"] == "deadbeef"
    assert got["sums_sha"] == hashlib.sha256((tmp_path / "SHA256SUMS").read_bytes()).hexdigest()
    assert got["files"]["x.bin"][0] == 3
    assert run_local(FolderCheck, path=str(tmp_path / "no"), sums="SHA256SUMS", marker="m") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_local(FolderCheck, path=str(empty), sums="SHA256SUMS", marker="m")["sums_sha"] is None


def test_rank_folder_sees_bins_partials_and_sidecar(tmp_path):
    (tmp_path / "rank1of2-0123456789abcdef0123.bin").write_bytes(b"w")
    (tmp_path / ".rank0of2.partial").write_bytes(b"p")
    (tmp_path / ".sparkfold-source").write_text(COMMIT + "\n")
    got = run_local(RankFolder, path=str(tmp_path))
    assert got == {"bins": {1: ["rank1of2-0123456789abcdef0123.bin"]}, "partial": [0], "source": COMMIT}
    assert run_local(RankFolder, path=str(tmp_path / "none")) == {"bins": {}, "partial": [], "source": None}


def test_small_file_facts(tmp_path):
    (tmp_path / "side").write_text(COMMIT + "\n")
    os.symlink("snapshots/" + COMMIT, tmp_path / "link")
    assert first_line(run_local(FileText, path=str(tmp_path / "side"))) == COMMIT
    assert run_local(FileText, path=str(tmp_path / "nope")) is None
    assert run_local(LinkTarget, path=str(tmp_path / "link")) == "snapshots/" + COMMIT
    assert run_local(LinkTarget, path=str(tmp_path / "side")) is None
    free = run_local(DiskFree, path=str(tmp_path / "not" / "yet"))["free_bytes"]
    assert isinstance(free, int) and free > 0


def test_hf_hub_python_fact_reads_huggingface_hub_and_hf_xet():
    import importlib.metadata

    import huggingface_hub

    assert run_local(HfHubPython, python=sys.executable) == {"hub": huggingface_hub.__version__,
                                                            "xet": importlib.metadata.version("hf-xet")}
    assert run_local(HfHubPython, python="/nonexistent/python3") is None
    assert parse_fact(HfHubPython, "#HUB \n#XET \n") == {"hub": "", "xet": ""}  # a python without either
    assert parse_fact(HfHubPython, "#HUB \n") == {"hub": "", "xet": ""}  # the python itself failed


def test_ablit_shards_fact(tmp_path):
    files = model_files()
    built = build_cache(tmp_path, "Org/M", files)
    got = run_local(AblitShards, snapshot=str(built["snapshot"]))
    assert got == {"model-00002-of-00002.safetensors": len(files["model-00002-of-00002.safetensors"])}
    assert run_local(AblitShards, snapshot=str(tmp_path / "none")) == {}


def test_peer_folder_parse_and_command():
    cmd = PeerFolder().command(target="nvidia@192.168.100.2", path="/d/engram", link="/d/l")
    assert cmd.startswith(f"{ssh_prefix(connect_timeout=5)} nvidia@192.168.100.2 ") and "|| true" in cmd
    got = parse_fact(PeerFolder, "a.bin\t5\t1700000000.5\n#FREE 1000\n#LINK k/rank1\n#OK\n")
    assert got == {"reachable": True, "files": {"a.bin": [5, 1700000000]}, "free": 1000, "link": "k/rank1"}
    assert parse_fact(PeerFolder, "")["reachable"] is False


def test_hf_plan_fact_parses_last_json_line():
    assert parse_fact(HfPlan, 'noise\n{"complete": true, "commit": "x"}\n') == {"complete": True, "commit": "x"}
    assert parse_fact(HfPlan, "Traceback...\n")["complete"] is False
    cmd = HfPlan().command(python="/v/bin/python", repo="o/r", revision="main", cache_dir="/h/hub",
                           token_path="/s/hf-token", endpoint="https://mirror")
    assert "HF_TOKEN_PATH=/s/hf-token" in cmd and "HF_ENDPOINT=https://mirror" in cmd and "--cache-dir /h/hub" in cmd


# ---- hf_hub_installed / private_file ----

HUB = {"hub": "2.4.0", "xet": "1.8.0"}
VENV = dict(python="/s/venv/bin/python", version="2.4.0", venv="/s/venv", env_file="/s/hf-env")


def test_the_pinned_hub_in_the_venv_is_converged():
    cmds, h = run_op(model_data.hf_hub_installed, {HfHubPython: HUB}, **VENV)
    assert cmds == [] and h.noops == ["huggingface_hub 2.4.0 on the head (hf_xet 1.8.0)"]


@pytest.mark.parametrize("have, venv_made", [({"hub": "2.3.1", "xet": "1.8.0"}, False),  # upgraded
                                              ({"hub": "2.5.0", "xet": "1.8.0"}, False),  # downgraded to the pin
                                              ({"hub": "2.4.0", "xet": ""}, False),  # hf_xet added
                                              ({"hub": "", "xet": ""}, False),  # a venv without it
                                              (None, True)])  # no venv yet
def test_the_venv_is_installed_into_until_it_has_exactly_the_pin(have, venv_made):
    cmds, _ = run_op(model_data.hf_hub_installed, {HfHubPython: have}, **VENV)
    assert len(cmds) == 1 + venv_made
    assert ("python3 -m venv /s/venv" in cmds[0]) == venv_made
    assert cmds[-1] == ("[ ! -r /s/hf-env ] || . /s/hf-env; /s/venv/bin/python -m pip install --quiet "
                        "--disable-pip-version-check 'huggingface_hub[hf_xet]==2.4.0'")


def test_pip_gets_the_proxies_of_the_env_file(tmp_path):
    env_file = tmp_path / "hf-env"
    env_file.write_text("export HTTPS_PROXY='http://u:s3cret@proxy:3128'\n")
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nenv > {tmp_path}/seen; echo \"$@\" > {tmp_path}/argv\n")
    fake.chmod(0o755)
    cmds, _ = run_op(model_data.hf_hub_installed, {HfHubPython: {"hub": "2.3.1", "xet": ""}}, python=str(fake),
                     version="2.4.0", venv=str(tmp_path), env_file=str(env_file))
    assert "s3cret" not in cmds[-1]
    subprocess.run(["sh", "-c", cmds[-1]], check=True)
    assert "HTTPS_PROXY=http://u:s3cret@proxy:3128" in (tmp_path / "seen").read_text().splitlines()
    assert (tmp_path / "argv").read_text().split()[-1] == "huggingface_hub[hf_xet]==2.4.0"


def test_the_users_python_is_checked_never_changed(caplog):
    given = dict(python="/usr/bin/python3", version="2.4.0", venv="")
    assert run_op(model_data.hf_hub_installed, {HfHubPython: {"hub": "2.4.0", "xet": ""}}, **given)[0] == []
    command, warnings = refused(caplog, model_data.hf_hub_installed, {HfHubPython: {"hub": "2.3.1", "xet": ""}},
                                **given)
    assert "hf_python: /usr/bin/python3 has huggingface_hub 2.3.1, not hf_hub_version 2.4.0" in command
    assert "pip install 'huggingface_hub[hf_xet]==2.4.0'" in warnings and "set hf_hub_version" in warnings
    command, warnings = refused(caplog, model_data.hf_hub_installed, {HfHubPython: {"hub": "", "xet": ""}}, **given)
    assert "hf_python: /usr/bin/python3 cannot import huggingface_hub" in command
    assert 'set hf_python to ""' in warnings


def test_the_plan_says_what_changes_in_the_heads_huggingface_hub():
    assert hub_change({"hub": "2.3.1", "xet": "1.8.0"}, "2.4.0", "/v") == "huggingface_hub 2.3.1 → 2.4.0 on the head"
    assert hub_change({"hub": "", "xet": ""}, "2.4.0", "/v") == "huggingface_hub none → 2.4.0 on the head"
    assert hub_change(None, "2.4.0", "/v") == "huggingface_hub 2.4.0 on the head (a new venv, /v)"
    assert hub_change(HUB, "2.4.0", "/v") == "huggingface_hub 2.4.0 on the head (hf_xet 1.8.0)"
    assert hub_change({"hub": "2.4.0", "xet": ""}, "2.4.0", "/v") == "huggingface_hub 2.4.0 on the head: hf_xet added"
    assert hub_change({"hub": "2.3.1", "xet": ""}, "2.4.0", "") == \
        "huggingface_hub 2.3.1 on the head (hf_python), hf_hub_version is 2.4.0"


def test_a_secret_file_is_uploaded_never_on_a_command_line():
    token = "hf_secretvalue123"
    cmds, _ = run_op(model_data.private_file, {Sha256File: None}, path="/s/hf-token", content=token, what="token")
    assert cmds[0] == "mkdir -p /s && install -m 600 /dev/null /s/hf-token"  # 0600 before the token lands in it
    assert cmds[1].startswith("FileUploadCommand(") and all(token not in c for c in cmds)


def test_a_secret_file_both_ways():
    token = "hf_secretvalue123"
    digest = hashlib.sha256(token.encode()).hexdigest()
    cmds, h = run_op(model_data.private_file, {Sha256File: digest}, path="/s/t", content=token, what="token")
    assert cmds == [] and h.noops == ["token is current"]
    assert len(run_op(model_data.private_file, {Sha256File: "0" * 64}, path="/s/t", content=token, what="t")[0]) == 2
    assert run_op(model_data.private_file, {Sha256File: digest}, path="/s/t", content="", what="t")[0] == ["rm -f /s/t"]
    assert run_op(model_data.private_file, {Sha256File: None}, path="/s/t", content="", what="t")[0] == []


def test_the_env_file_holds_the_variables_and_its_name_only_their_names(tmp_path):
    env = {"HTTPS_PROXY": "http://u:s3cret@proxy:3128", "HF_HUB_DOWNLOAD_TIMEOUT": "60", "NO_PROXY": "a b,'c'"}
    text = hub_env_text(env)
    name = hub_env_name(env)
    assert name == ("huggingface_hub variables for the head's downloads (0600 file): HF_HUB_DOWNLOAD_TIMEOUT, "
                    "HTTPS_PROXY, NO_PROXY") and "s3cret" not in name
    (tmp_path / "hf-env").write_text(text)
    out = subprocess.run(["sh", "-c", f". {tmp_path}/hf-env; printf '%s|' \"$HTTPS_PROXY\" \"$NO_PROXY\" "
                          "\"$HF_HUB_DOWNLOAD_TIMEOUT\""], capture_output=True, text=True, check=True).stdout
    assert out == "http://u:s3cret@proxy:3128|a b,'c'|60|"
    assert hub_env_text({}) == "" and "none set" in hub_env_name({})


def test_the_token_line_names_its_source_never_the_token():
    assert token_name("HF_TOKEN") == "Hugging Face token for the head's downloads (0600 file): from HF_TOKEN"
    assert "anonymous" in token_name("")


# ---- hf_snapshot ----

SNAP = dict(python="/v/bin/python", repo="Org/M", revision="main", label="Checkpoint", cache_dir="/h/hub",
            token_path="/s/hf-token", has_token=True, expect_model_type="deepseek_v41", every=10)


def test_snapshot_complete_fetches_nothing():
    cmds, h = run_op(model_data.hf_snapshot, {HfPlan: complete_plan(), DiskFree: {"free_bytes": 10}}, **SNAP)
    assert cmds == [] and "nothing to fetch" in h.noops[0]


def test_snapshot_missing_fetches_with_token_by_path():
    plan = complete_plan(complete=False, manifest=False, missing=[["model-1.safetensors", 150]], missing_bytes=150)
    cmds, _ = run_op(model_data.hf_snapshot, {HfPlan: plan, DiskFree: {"free_bytes": 10**6}}, **SNAP)
    assert len(cmds) == 1
    first_line = cmds[0].splitlines()[0]
    assert "HF_TOKEN_PATH=/s/hf-token" in first_line and "--expect-model-type deepseek_v41" in first_line
    assert "snapshot_download" in cmds[0]  # the fetch script travels with the command


def test_the_download_gets_the_env_file_the_token_path_and_max_workers(tmp_path):
    """What the head's download receives: the variables of the hf-env file in its environment (never on its command
    line), HF_TOKEN_PATH and HF_ENDPOINT, and --max-workers for parallel files."""
    env_file = tmp_path / "hf-env"
    env_file.write_text("export HTTPS_PROXY='http://u:s3cret@proxy:3128'\nexport HF_XET_HIGH_PERFORMANCE=1\n")
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nenv > {tmp_path}/seen; echo \"$@\" > {tmp_path}/argv; cat > /dev/null\n")
    fake.chmod(0o755)
    plan = complete_plan(complete=False, manifest=False, missing=[["model-1.safetensors", 150]], missing_bytes=150)
    args = dict(SNAP, python=str(fake), cache_dir=str(tmp_path / "hub"), env_file=str(env_file), max_workers=3,
                endpoint="https://mirror.example")
    cmds, _ = run_op(model_data.hf_snapshot, {HfPlan: plan, DiskFree: {"free_bytes": 10**6}}, **args)
    _label, fetch, _options = unwrap_progress(cmds[0])
    assert "s3cret" not in cmds[0]
    subprocess.run(["sh", "-c", fetch], check=True, timeout=30)
    seen = (tmp_path / "seen").read_text().splitlines()
    for line in ("HTTPS_PROXY=http://u:s3cret@proxy:3128", "HF_XET_HIGH_PERFORMANCE=1", "HF_TOKEN_PATH=/s/hf-token",
                 "HF_ENDPOINT=https://mirror.example"):
        assert line in seen, line
    argv = (tmp_path / "argv").read_text().split()
    assert argv[argv.index("--max-workers") + 1] == "3" and argv[argv.index("--cache-dir") + 1] == str(tmp_path / "hub")


def test_a_download_prints_a_line_every_progress_every_s():
    """Both the progress wrapper and the download's own file count (hf_fetch.py --every) come that often."""
    plan = complete_plan(complete=False, manifest=False, missing=[["model-1.safetensors", 150]], missing_bytes=150)
    cmds, _ = run_op(model_data.hf_snapshot, {HfPlan: plan, DiskFree: {"free_bytes": 10**6}}, **dict(SNAP, every=2))
    _label, fetch, options = unwrap_progress(cmds[0])
    assert options[options.index("--every") + 1] == "2"
    words = shlex.split(fetch.split(" <<'SPARKFOLD_PY_EOF'")[0])
    assert words[words.index("--every") + 1] == "2"


def test_the_deploy_names_the_token_source_and_the_variables_never_their_values(recorded):
    s = settings(hf_token="hf_x").replace(hf_token_source="HF_TOKEN", hf_env={"HTTPS_PROXY": "http://u:s3cret@p:1"})
    DEPLOY(s)
    token, env = recorded[0][1], recorded[1][1]
    assert token["name"].endswith("from HF_TOKEN") and token["content"] == "hf_x"
    assert env["name"].endswith(": HTTPS_PROXY") and env["content"] == "export HTTPS_PROXY=http://u:s3cret@p:1\n"
    assert not any("s3cret" in call[1]["name"] or "hf_x" in call[1]["name"] for call in recorded)


def test_a_given_hf_python_is_checked_and_gets_no_venv(recorded):
    DEPLOY(settings(hf_python="python3", hf_max_workers=16))
    hub = next(kw for op, kw in recorded if op == "hf_hub_installed")
    assert hub["python"] == "python3" and hub["venv"] == ""
    assert hub["name"] == "huggingface_hub 2.3.1 on the head (hf_python), hf_hub_version is 2.4.0"
    assert all(kw["max_workers"] == 16 for op, kw in recorded if op == "hf_snapshot")


def test_snapshot_wrong_model_type_fails(caplog):
    command, warnings = refused(caplog, model_data.hf_snapshot, {HfPlan: complete_plan(model_type="llama"),
                                                                  DiskFree: {"free_bytes": 10}}, **SNAP)
    assert command.startswith("echo 'sparkfold: Checkpoint: Org/M@") and "llama" in command
    assert "will fail: Checkpoint: Org/M@" in warnings and "model_type 'llama', not 'deepseek_v41'" in warnings
    assert "check the repo/revision" in warnings


def test_snapshot_not_enough_disk_fails_before_writing():
    plan = complete_plan(complete=False, missing=[["x", 300 * 2**30]], missing_bytes=300 * 2**30)
    cmds, _ = run_op(model_data.hf_snapshot, {HfPlan: plan, DiskFree: {"free_bytes": 100 * 2**30}}, executing=True,
                     **SNAP)
    assert len(cmds) == 1 and "needs 300.0 GiB free under /h/hub" in cmds[0] and "has 100.0 GiB" in cmds[0]


def test_gated_snapshot_without_token_refuses_before_any_fact(caplog):
    command, warnings = refused(caplog, model_data.hf_snapshot, {}, **dict(SNAP, has_token=False),
                                require_token=True)  # {}: no fact is read
    assert "HF_TOKEN: Checkpoint is gated: set HF_TOKEN" in command
    assert "will fail: HF_TOKEN: Checkpoint is gated" in warnings and "export HF_TOKEN=<token>" in warnings


def test_fetch_summary_names_files_and_gib():
    plan = {"complete": False, "missing": [["a", 1], ["b", 2]], "missing_bytes": 3 * 2**30, "commit": COMMIT}
    assert model_data.fetch_summary("Engram", plan, "o/r", "main", "/d") == \
        f"Engram: fetch 2 files, 3.0 GiB of o/r@{COMMIT[:12]} into /d"
    assert "nothing to fetch" in model_data.fetch_summary("E", complete_plan(), "o/r", "main", "/d")
    assert "size unknown" in model_data.fetch_summary("E", {"error": "offline"}, "o/r", "main", "/d")


# ---- checksums, verification, copies ----

def _check(files, names, marker=None, sums_sha="f" * 64):
    return {"files": files, "names": names, "marker": marker, "sums_sha": sums_sha}


ENGRAM = {"m-47.safetensors": [100, 1700000000], "m-48.safetensors": [120, 1700000001]}


def test_checksums_written_once():
    names = sorted(ENGRAM)
    state = listing_digest(ENGRAM, names)
    fact = {FolderCheck: _check(dict(ENGRAM), names, marker=state)}
    assert run_op(data_copy.checksums_written, fact, folder="/d/engram", files=names, every=10)[0] == []
    changed = dict(ENGRAM, **{"m-48.safetensors": [120, 1700009999]})
    cmds, _ = run_op(data_copy.checksums_written, {FolderCheck: _check(changed, names, marker=state)},
                     folder="/d/engram", files=names, every=10)
    label, hashing, options = unwrap_progress(cmds[0])  # minutes on real data: progress lines while it hashes
    assert label == "the files: hashing for SHA256SUMS" and "--own-work" in options
    assert "exec sha256sum -- m-47.safetensors m-48.safetensors > SHA256SUMS.tmp" in hashing
    assert options[options.index("--total") + 1] == "220"
    assert "mv SHA256SUMS.tmp SHA256SUMS" in cmds[1] and listing_digest(changed, names) in cmds[1]


def test_checksums_refuse_missing_files_when_executing():
    cmds, _ = run_op(data_copy.checksums_written, {FolderCheck: None}, executing=True, folder="/d/e", files=["a"],
                     every=10)
    assert "exit 1" in cmds[0] and "a missing" in cmds[0]


def test_folder_verified_marker_skips_rehash():
    names = sorted(ENGRAM)
    marker = listing_digest(ENGRAM, names, "f" * 64)
    cmds, _ = run_op(data_copy.folder_verified, {FolderCheck: _check(ENGRAM, names, marker)}, folder="/d/engram",
                     sums="SHA256SUMS", what="Engram", every=10)
    assert cmds == []


def test_folder_verified_after_transfer_runs_sha256sum():
    names = sorted(ENGRAM)
    old = listing_digest(ENGRAM, names, "f" * 64)
    moved = dict(ENGRAM, **{"m-47.safetensors": [100, 1800000000]})
    cmds, _ = run_op(data_copy.folder_verified, {FolderCheck: _check(moved, names, old)}, executing=True,
                     folder="/d/engram", sums="SHA256SUMS", what="Engram", every=10)
    label, hashing, options = unwrap_progress(cmds[0])
    assert label == "Engram: checking SHA256SUMS" and hashing.startswith("cd /d/engram && sh -c ")
    assert "exec sha256sum -c --quiet SHA256SUMS'" in hashing and "does not match SHA256SUMS" in hashing
    assert options[options.index("--total") + 1] == str(sum(v[0] for v in moved.values()))
    marker = data_copy.marker_written(data_copy.MARKER, listing_digest(moved, names, "f" * 64))
    assert cmds[1] == f"cd /d/engram && {marker}"


def _damaged_copy(tmp_path):
    """A head folder and the worker's copy of it, where bad.bin keeps its size and mtime but not its content."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    head.mkdir()
    for name, data in {"good.bin": b"good" * 100, "bad.bin": b"data" * 100}.items():
        (head / name).write_bytes(data)
    (head / "SHA256SUMS").write_text("".join(f"{hashlib.sha256((head / n).read_bytes()).hexdigest()}  {n}\n"
                                             for n in ("good.bin", "bad.bin")))
    shutil.copytree(head, worker)  # copy2: sizes and mtimes kept, as rsync -a and the stream keep them
    stat = (worker / "bad.bin").stat()
    (worker / "bad.bin").write_bytes(b"dat!" * 100)
    os.utime(worker / "bad.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return head, worker


def _check_for_real(worker, all_present=False, **kwargs):
    """folder_verified's command run in a shell; all_present: as if every listed name were a file there (a fact read
    before the folder changed), so that sha256sum itself meets each name."""
    check = run_fact(FolderCheck, path=str(worker), sums="SHA256SUMS", marker=data_copy.MARKER)
    if all_present:
        check["files"].update({name: [0, 0] for name in check["names"] if name not in check["files"]})
    cmds, _ = run_op(data_copy.folder_verified, {FolderCheck: check}, executing=True, folder=str(worker),
                     sums="SHA256SUMS", what="the test files", every=10, **kwargs)
    return subprocess.run(["sh", "-c", cmds[0]], capture_output=True, text=True, timeout=60)


def test_a_worker_file_that_fails_its_check_is_removed_so_the_next_run_copies_it(tmp_path):
    head, worker = _damaged_copy(tmp_path)
    peer = dict(PEER, src=str(head), dest=str(worker))

    def copy_commands():
        facts = {DirFiles: run_fact(DirFiles, path=str(head)), PeerFolder: _peer(run_fact(DirFiles, path=str(worker)))}
        return run_op(data_copy.folder_to_peer, facts, executing=True, **peer)[0]

    assert copy_commands() == []  # size and mtime match: the copy alone would never look at it again
    checked = _check_for_real(worker, remove_failed=True)
    assert checked.returncode != 0 and "bad.bin: FAILED" in checked.stderr
    assert "removed bad.bin" in checked.stderr and "re-run the deploy to copy them again" in checked.stderr
    assert not (worker / "bad.bin").exists() and (worker / "good.bin").read_bytes() == b"good" * 100
    assert copy_commands()  # the next run copies it again


def test_a_check_that_does_not_remove_leaves_the_files(tmp_path):
    _head, worker = _damaged_copy(tmp_path)  # e.g. the head's kit: its files are a download's hard links
    checked = _check_for_real(worker)
    assert checked.returncode != 0 and (worker / "bad.bin").read_bytes() == b"dat!" * 100


def test_only_files_inside_the_folder_are_removed_whatever_the_list_names(tmp_path):
    _head, worker = _damaged_copy(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_bytes(b"kept")
    (worker / "sub").symlink_to(outside)
    (worker / "link.bin").symlink_to(worker / "good.bin")
    hostile = ["sub/kept", "../outside/kept", str(outside / "kept"), "link.bin", "./good.bin"]
    with open(worker / "SHA256SUMS", "a") as sums:  # the list crossed the cable: wrong sums for files not its own
        sums.writelines(f"{'0' * 64}  {name}\n" for name in hostile)
    checked = _check_for_real(worker, all_present=True, remove_failed=True)
    assert checked.returncode != 0 and not (worker / "bad.bin").exists()
    assert (outside / "kept").read_bytes() == b"kept" and (worker / "sub").is_symlink()
    assert (worker / "link.bin").is_symlink() and (worker / "good.bin").exists()


def test_kit_missing_only_generated_files_says_so():
    names = ["cubins/linear.cubin", "rope-plain-cos.f32", "vision/gate_bias_vl.safetensors"]
    files = {"cubins/linear.cubin": [5, 1], "MANIFEST": [9, 1]}
    cmds, _ = run_op(data_copy.folder_verified, {FolderCheck: _check(files, names)}, executing=True,
                     folder="/d/kit", sums="MANIFEST", what="the kit", generated_fix=model_data.KIT_GENERATED_FIX,
                     every=10)
    assert "only the generated files are missing" in cmds[0] and "torch" in cmds[0] and "exit 1" in cmds[0]
    other = {"MANIFEST": [9, 1]}
    cmds, _ = run_op(data_copy.folder_verified, {FolderCheck: _check(other, names)}, executing=True,
                     folder="/d/kit", sums="MANIFEST", what="the kit", generated_fix=model_data.KIT_GENERATED_FIX,
                     every=10)
    assert "3 files of MANIFEST are missing" in cmds[0]


def test_folder_verified_without_sums_plans_then_fails():
    kw = dict(folder="/d/k", sums="MANIFEST", what="kit", every=10)
    assert run_op(data_copy.folder_verified, {FolderCheck: None}, **kw)[0][0].startswith("# will verify")
    assert "exit 1" in run_op(data_copy.folder_verified, {FolderCheck: None}, executing=True, **kw)[0][0]


PEER = dict(src="/d/engram", target="nvidia@10.0.0.2", dest="/w/engram", what="Engram", every=10)


def _peer(files, reachable=True, free=10**12, link=None):
    return {"reachable": reachable, "files": files, "free": free, "link": link}


def test_folder_to_peer_in_step_is_noop():
    facts = {DirFiles: dict(ENGRAM, **{".cache/huggingface/x.metadata": [1, 1]}), PeerFolder: _peer(dict(ENGRAM))}
    cmds, h = run_op(data_copy.folder_to_peer, facts, executing=True, **PEER)
    assert cmds == [] and "matches" in h.noops[0]


def test_folder_to_peer_ignores_what_it_never_copies():
    # a killed download leaves huggingface_hub's partial blobs in a cache folder; rsync excludes them, so comparing
    # them would plan the copy again on every run
    left = {"blobs/390a466e.1d337c6e.incomplete": [0, 5], data_copy.MARKER: [65, 5]}
    facts = {DirFiles: dict(ENGRAM, **left), PeerFolder: _peer(dict(ENGRAM))}
    cmds, h = run_op(data_copy.folder_to_peer, facts, executing=True, **PEER)
    assert cmds == [] and "matches" in h.noops[0]
    # and a real difference next to them is still copied, with those names excluded
    facts = {DirFiles: dict(ENGRAM, **left), PeerFolder: _peer({})}
    copy = unwrap_progress(run_op(data_copy.folder_to_peer, facts, executing=True, **PEER)[0][0])[1]
    words = shlex.split(copy.split(" <<'SPARKFOLD_PY_EOF'")[0])
    assert {"--rsync-option=--exclude=*.incomplete", f"--rsync-option=--exclude={data_copy.MARKER}"} <= set(words)


def test_folder_to_peer_copies_differences_resumably():
    cmds, _ = run_op(data_copy.folder_to_peer, {DirFiles: ENGRAM, PeerFolder: _peer({})}, executing=True, **PEER)
    assert len(cmds) == 1
    label, copy, options = unwrap_progress(cmds[0])  # the worker's copy measured over ssh while it runs
    assert label.endswith("to the worker") and "du -sb /w/engram" in options[options.index("--probe") + 1]
    head = shlex.split(copy.split(" <<'SPARKFOLD_PY_EOF'")[0])
    assert head[:3] == ["python3", "-", "/d/engram"] and "def start_daemon" in copy  # link_copy.py, on stdin
    assert head[head.index("--target") + 1] == "nvidia@10.0.0.2" and head[head.index("--dest") + 1] == "/w/engram"
    options = [w.split("=", 1)[1] for w in head if w.startswith("--rsync-option=")]
    assert options[:2] == ["-a", "--partial-dir=.sparkfold-partial"] and "--exclude=/.cache/" in options


def test_folder_to_peer_checks_worker_space_and_reachability():
    cmds, _ = run_op(data_copy.folder_to_peer, {DirFiles: ENGRAM, PeerFolder: _peer({}, free=50)}, executing=True,
                     **PEER)
    assert "needs" in cmds[0] and "nvidia@10.0.0.2:/w/engram" in cmds[0] and "exit 1" in cmds[0]
    cmds, _ = run_op(data_copy.folder_to_peer, {DirFiles: ENGRAM, PeerFolder: _peer({}, reachable=False)},
                     executing=True, **PEER)
    assert "cannot reach" in cmds[0]
    # planning on a fresh pair: the link is not up yet, the copy is still planned
    cmds, _ = run_op(data_copy.folder_to_peer, {DirFiles: {}, PeerFolder: _peer({}, reachable=False)}, **PEER)
    assert unwrap_progress(cmds[0])[1].startswith("python3 - /d/engram ")


def test_folder_to_peer_fixes_only_the_symlink():
    facts = {DirFiles: ENGRAM, PeerFolder: _peer(dict(ENGRAM), link="old/rank1")}
    cmds, _ = run_op(data_copy.folder_to_peer, facts, executing=True, **PEER, symlink="/w/active-rank1",
                     symlink_target="new/rank1")
    assert cmds == [f"{data_copy.SSH} nvidia@10.0.0.2 'ln -sfn new/rank1 /w/active-rank1'"]


def test_folder_placed_converged_and_changed():
    src = {"MANIFEST": [10, 5], "aot/aot.json": [3, 5]}
    link = {LinkTarget: table(({"path": "/d/kit"}, "kit.d/abc"))}
    facts = {DirFiles: table(({"path": "/d/kit-src/kit"}, src),
                             ({"path": "/d/kit"}, dict(src, **{".sparkfold-verified": [65, 6]}))), **link}
    assert run_op(data_copy.folder_placed, facts, src="/d/kit-src/kit", dest="/d/kit", what="kit")[0] == []
    facts = {DirFiles: table(({"path": "/d/kit-src/kit"}, src), ({"path": "/d/kit"}, {})), **link}
    cmds, _ = run_op(data_copy.folder_placed, facts, src="/d/kit-src/kit", dest="/d/kit", what="kit")
    assert "cp -rl /d/kit-src/kit" in cmds[0] and "rm -rf /d/kit" not in cmds[0]
    # an older layout's real folder (no link) is replaced too, by moving it aside
    facts = {DirFiles: table(({"path": "/d/kit-src/kit"}, src), ({"path": "/d/kit"}, src)),
             LinkTarget: table(({"path": "/d/kit"}, None))}
    assert run_op(data_copy.folder_placed, facts, src="/d/kit-src/kit", dest="/d/kit", what="kit")[0]


def _place(tmp_path, data):
    src = tmp_path / "kit-src" / "kit"
    for name, text in data.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    dest = tmp_path / "data" / "kit"
    dest.parent.mkdir(exist_ok=True)
    facts = {DirFiles: table(({"path": str(src)}, {"x": [1, 1]}), ({"path": str(dest)}, {})),
             LinkTarget: table(({"path": str(dest)}, None))}
    cmds, _ = run_op(data_copy.folder_placed, facts, src=str(src), dest=str(dest), what="kit")
    subprocess.run(["sh", "-c", cmds[0]], check=True)
    return dest


def test_folder_placed_switches_versions_and_never_empties_the_mounted_one(tmp_path):
    dest = _place(tmp_path, {"MANIFEST": "one", "aot/a.json": "1"})
    first = dest.resolve()
    assert dest.is_symlink() and first.parent.name == "kit.d" and (dest / "aot/a.json").read_text() == "1"
    held = open(first / "aot" / "a.json")  # a running rank's view of the old version
    (tmp_path / "kit-src/kit/aot/a.json").unlink()  # a new kit revision: a file replaced, another added
    dest = _place(tmp_path, {"MANIFEST": "two", "aot/a.json": "2", "aot/b.json": "3"})
    second = dest.resolve()
    assert second != first and (dest / "aot/b.json").read_text() == "3"
    assert (first / "aot" / "a.json").read_text() == "1" and held.read() == "1"  # the old version is whole
    assert _place(tmp_path, {}).resolve() == second  # same content: same version, nothing copied
    # the old version stays until the pair step's generations_kept judges it (test_rank_generation.py)
    assert first.exists()


def test_folder_placed_moves_an_old_real_folder_aside(tmp_path):
    old = tmp_path / "data" / "kit"
    old.mkdir(parents=True)
    (old / "MANIFEST").write_text("old")
    dest = _place(tmp_path, {"MANIFEST": "new"})
    assert dest.is_symlink() and (dest / "MANIFEST").read_text() == "new"
    aside = [p for p in (tmp_path / "data" / "kit.d").iterdir() if p.name.startswith("replaced-")]
    assert len(aside) == 1 and (aside[0] / "MANIFEST").read_text() == "old"


def test_a_folder_moved_aside_is_named_in_the_plan_and_the_output(tmp_path, caplog):
    """The real folder an older layout (or the user) had at data_dir/kit is moved to kit.d/replaced-<time>, "not
    deleted": the plan and the run say where (the generations' pruning leaves replaced-* alone:
    test_rank_generation.py)."""
    old = tmp_path / "data" / "kit"
    old.mkdir(parents=True)
    (old / "MANIFEST").write_text("mine")
    src = tmp_path / "kit-src" / "kit"
    src.mkdir(parents=True)
    (src / "MANIFEST").write_text("new")
    facts = {DirFiles: table(({"path": str(src)}, {"MANIFEST": [3, 1]}), ({"path": str(old)}, {"MANIFEST": [4, 1]})),
             LinkTarget: table(({"path": str(old)}, None))}
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds, _ = run_op(data_copy.folder_placed, facts, src=str(src), dest=str(old), what="the kit")
    assert f"{old} is a folder, not sparkfold's symlink: it is moved to {old}.d/replaced-" in caplog.text  # the plan
    done = subprocess.run(["sh", "-c", cmds[0]], capture_output=True, text=True, check=True)
    versions = tmp_path / "data" / "kit.d"
    aside = [p for p in versions.iterdir() if p.name.startswith("replaced-")]
    assert len(aside) == 1 and (aside[0] / "MANIFEST").read_text() == "mine"
    assert f"moved to {aside[0]}, kept" in done.stdout  # the run's output names the place


def test_blob_sums_listed_from_names():
    blob = "blobs/" + "c" * 64
    fact = {FolderCheck: _check({blob: [5, 1], "refs/main": [40, 1]}, [blob])}
    assert run_op(model_data.blob_sums_written, fact, repo_dir="/h/hub/models--o--r")[0] == []
    fact = {FolderCheck: _check({blob: [5, 1], "blobs/" + "d" * 64: [6, 1]}, [blob])}
    cmds, _ = run_op(model_data.blob_sums_written, fact, repo_dir="/h/hub/models--o--r")
    assert "> .sparkfold-SHA256SUMS.tmp" in cmds[0]


def test_blob_sums_shell_matches_what_the_worker_checks(tmp_path):
    """The generated list is valid sha256sum -c input for LFS blobs."""
    built = build_cache(tmp_path, "o/r", model_files())
    fact = {FolderCheck: _check({}, [])}
    cmd = run_op(model_data.blob_sums_written, fact, repo_dir=str(built["repo_dir"]))[0][0]
    subprocess.run(["sh", "-c", cmd], check=True)
    subprocess.run(["sha256sum", "-c", "--quiet", ".sparkfold-SHA256SUMS"], cwd=built["repo_dir"], check=True)
    assert len((built["repo_dir"] / ".sparkfold-SHA256SUMS").read_text().splitlines()) == 2  # the two shards


# ---- served path and the deploy function ----

def settings(is_head=True, hf_token="", **over):
    """Real Settings (home /home/n) with small repos, as the tests below name them."""
    over = {"model_repo": "Org/M", "engram_repo": "deepseek-ai/E", "engram_files": ["config.json", "e.safetensors"],
            "kit_repo": "b/kit", "ablit_repo": "d/ablit", "ablit_revision": "r" * 40, "ablit_file": "w.safetensors",
            **over}
    return make_settings("head" if is_head else "worker", environ={"HF_TOKEN": hf_token}, home="/home/n", **over)


DEPLOY = model_data.model_data._inner  # the step itself, before `recorded` swaps the operations for recorders
CHECKED = model_data.model_data_checked._inner


def test_served_model_path_stock_ablit_and_worker():
    host_dir, inside = served_model_path(settings())
    assert host_dir == "/home/n/.cache/huggingface"
    assert inside == "/root/.cache/huggingface/hub/models--Org--M/sparkfold-current"
    assert served_model_path(settings(ablit=True)) == ("/home/n/.cache/sparkfold/ablit",
                                                                  "/model-ablit/current")
    assert served_model_path(settings(is_head=False, ablit=True))[0] == "sparkfold-hf"
    assert served_model_path(settings(is_head=False, worker_weights="copy"))[0] == \
        "/home/n/.cache/huggingface"


@pytest.fixture
def recorded(monkeypatch):
    """Every op the deploy function calls, with its name and arguments (no pyinfra state needed); a stream started
    in the background is recorded as ("background", stream name) with its stream, upstream and work."""
    calls = []
    from operations.data import ablit, weights
    from operations.data import background as background_data

    def recorder(label):
        def record(**kw):
            calls.append((label, kw))
        record.__name__ = label  # a stream's work names its operation
        return record

    def background(stream, name, upstream=(), work=()):
        calls.append((("background", stream.name), {"stream": stream, "name": name, "upstream": list(upstream),
                                                    "work": list(work)}))
        return stream.name  # stands in for the operation's meta: what the streams that read it name

    for module in (model_data, weights, ablit, background_data):
        for attr in dir(module):
            obj = getattr(module, attr)
            if hasattr(obj, "_inner"):
                monkeypatch.setattr(module, attr, recorder(attr))
    monkeypatch.setattr(model_data, "background", background)
    monkeypatch.setattr(background_data, "background", background)
    monkeypatch.setattr(model_data, "_plan", lambda args: {"complete": False, "missing": [["f", 2**30]],
                                                           "missing_bytes": 2**30, "commit": COMMIT,
                                                           "total_bytes": 2**31})
    monkeypatch.setattr(model_data, "_hub_versions", lambda python: {"hub": "2.3.1", "xet": "1.8.0"})
    monkeypatch.setattr(model_data, "hf_plans_kept", lambda spark, requests: None)  # test_every_plan_is_batched
    return calls


def streams_of(recorded) -> dict:
    return {c[0][1]: c[1] for c in recorded if isinstance(c[0], tuple)}


def test_deploy_head_starts_the_long_work_in_the_background(recorded):
    DEPLOY(settings())
    ops = [c[0] for c in recorded]
    # the token and the variables first: pip needs the proxies too; then the downloads start in the background
    assert ops[:4] == ["private_file", "private_file", "hf_hub_installed", ("background", "engram")]
    hub = recorded[2][1]
    assert hub == {"name": "huggingface_hub 2.3.1 → 2.4.0 on the head", "python": "/home/n/.local/state/sparkfold/venv/"
                   "bin/python", "version": "2.4.0", "venv": "/home/n/.local/state/sparkfold/venv",
                   "env_file": "/home/n/.local/state/sparkfold/hf-env"}
    assert recorded[1][1]["path"] == "/home/n/.local/state/sparkfold/hf-env" and recorded[1][1]["content"] == ""
    streams = streams_of(recorded)
    assert list(streams) == ["engram", "engram-sums", "engram-to-worker", "engram-checked", "checkpoint",
                             "kit-to-worker", "kit-checked", "token-map", "rank1", "rank1-sums", "rank0",
                             "rank1-to-worker", "rank1-checked", "token-map-to-worker"]
    assert streams["checkpoint"]["name"] == (f"Checkpoint: fetch 1 files, 1.0 GiB of Org/M@{COMMIT[:12]} into "
                                             "/home/n/.cache/huggingface/hub")
    # the downloads one after the other, each the hub operation's own work
    assert streams["checkpoint"]["stream"].after == ("engram",)
    fetch = streams["checkpoint"]["work"][0][1]
    assert fetch["expect_model_type"] == "deepseek_v41"
    assert fetch["env_file"] == "/home/n/.local/state/sparkfold/hf-env" and fetch["max_workers"] == 8
    # the kit is small: placed and checked here, between the downloads' start and its copy
    kit = [op for op in ops if op in ("hf_snapshot", "folder_placed", "folder_verified")]
    assert kit == ["hf_snapshot", "folder_placed", "folder_verified"]
    assert ops.index("folder_verified") < ops.index(("background", "kit-to-worker"))
    # each stream waits for what it reads, and starts with it
    graph = {name: (c["stream"].after, c["upstream"]) for name, c in streams.items()}
    assert graph["engram-to-worker"] == (("engram",), ["engram"])  # copied while it is hashed
    assert graph["engram-checked"] == (("engram-sums", "engram-to-worker"), ["engram-sums", "engram-to-worker"])
    assert graph["token-map"] == (("image", "checkpoint"), ["checkpoint"])  # the image is waited for, not a reason
    assert graph["rank1"] == (("image", "checkpoint", "token-map"), ["checkpoint"])
    assert graph["rank0"] == (("image", "checkpoint", "rank1"), ["checkpoint"])  # rank 1's first: its copy waits
    assert graph["rank1-to-worker"] == (("rank1",), ["rank1"])
    assert graph["rank1-checked"] == (("rank1-sums", "rank1-to-worker"), ["rank1-sums", "rank1-to-worker"])
    assert all("_sudo" not in c[1] for c in recorded)  # everything lives in the ssh user's folders


def test_deploy_head_copy_mode_copies_the_checkpoint_once_listed(recorded):
    DEPLOY(settings(worker_weights="copy"))
    streams = streams_of(recorded)
    assert streams["blob-list"]["stream"].after == ("checkpoint",)
    repo_dir = "/home/n/.cache/huggingface/hub/models--Org--M"
    assert streams["blob-list"]["work"][0] == (model_data.blob_sums_written, {"repo_dir": repo_dir})
    # the copy carries the served snapshot's symlink: it is made before the copy, not after the background work
    served = streams["blob-list"]["work"][1][1]
    assert served["symlink"] == f"{repo_dir}/sparkfold-current" and served["template"] == "snapshots/{commit}"
    assert f"ln -sfn snapshots/{COMMIT} {repo_dir}/sparkfold-current.new-link" in \
        streams["blob-list"]["stream"].commands[1]
    assert streams["checkpoint-to-worker"]["upstream"] == ["checkpoint", "blob-list"]
    assert "--copy-unsafe-links" in " ".join(streams["checkpoint-to-worker"]["stream"].commands)
    assert streams["checkpoint-checked"]["upstream"] == ["checkpoint-to-worker"]


@pytest.mark.parametrize("ablit", [False, True])
def test_every_plan_the_deploy_asks_is_read_in_the_one_batch(recorded, monkeypatch, ablit):
    """hf_plans_kept is given every download the step plans, with the same arguments, before the first plan is
    asked: a converged run then reads all of them in one round trip."""
    batched, asked = [], []
    monkeypatch.setattr(model_data, "hf_plans_kept", lambda spark, requests: batched.append(list(requests)))
    monkeypatch.setattr(model_data, "_plan", lambda args: asked.append((len(batched), args)) or {"commit": COMMIT})
    s = settings(ablit=ablit, hf_token="t" if ablit else "")
    DEPLOY(s)
    CHECKED(s)
    assert len(batched) == 1 and asked
    assert {len(batched) for _, _ in asked} == {1}  # every plan asked after the batch
    missing = [args["repo"] for _, args in asked if args not in batched[0]]
    assert not missing, missing
    assert ("d/ablit" in [r["repo"] for r in batched[0]]) == ablit


def test_deploy_head_ablit_writes_the_weight_files_after_the_background_work(recorded):
    s = settings(ablit=True, hf_token="t")
    DEPLOY(s)
    assert not {"token-map", "rank1", "rank0"} & set(streams_of(recorded))
    recorded.clear()
    CHECKED(s)
    ops = [c[0] for c in recorded]
    overlay = [c[1] for c in recorded if c[0] == "hf_snapshot"][-1]
    assert overlay["require_token"] and overlay["include"] == ("w.safetensors", "apply_mia_exl3_wob.py")
    assert ops.index("ablit_applied") < ops.index("rank_file_written")
    ranks = [c[1] for c in recorded if c[0] == "rank_file_written"]
    assert all(r["ablit_dir"] == "/home/n/.cache/sparkfold/ablit" for r in ranks)
    assert ops.index("rank_file_to_peer") < ops.index("both_sparks_reached")


def test_deploy_head_checked_links_the_served_snapshot_and_rank_0(recorded):
    CHECKED(settings())
    symlinks = [c[1]["symlink"] for c in recorded if c[0] == "commit_symlink"]
    assert symlinks == ["/home/n/.cache/huggingface/hub/models--Org--M/sparkfold-current",
                        "/home/n/.cache/sparkfold/rank-cache/active-rank0"]
    assert [c[0] for c in recorded][-1] == "both_sparks_reached"


def test_deploy_worker_only_verifies(recorded):
    DEPLOY(settings(is_head=False))
    assert recorded == []
    CHECKED(settings(is_head=False))
    assert [c[0] for c in recorded] == ["both_sparks_reached"] + ["folder_verified"] * 3
    assert recorded[3][1]["folder"] == "/home/n/.cache/sparkfold/rank-cache/active-rank1"
    assert all(c[1]["remove_failed"] for c in recorded[1:])  # all copies: a damaged file goes, the next run copies it


def _takes_every() -> set[str]:
    """The operations of the model data step that print progress lines: they take `every`."""
    from operations.data import ablit, weights
    from operations.data import background as background_data
    return {name for module in (model_data, weights, ablit, background_data, data_copy)
            for name, obj in vars(module).items()
            if hasattr(obj, "_inner") and "every" in inspect.signature(obj._inner).parameters}


TAKES_EVERY = _takes_every()  # read before `recorded` swaps the operations for recorders


@pytest.mark.parametrize("over", [{}, {"worker_weights": "copy", "verify_data": True}, {"ablit": True}])
def test_progress_every_s_reaches_every_long_step_of_the_model_data(recorded, over):
    """Each operation with progress lines is given the setting, and every stream's progress lines come that often."""
    for role in ("head", "worker"):
        s = settings(is_head=role == "head", hf_token="t", progress_every_s=2, **over)
        DEPLOY(s)
        CHECKED(s)
    streams = streams_of(recorded).values()
    calls = [(name, kw) for name, kw in recorded if name in TAKES_EVERY]
    calls += [(op.__name__, kw) for c in streams for op, kw in c["work"] if op.__name__ in TAKES_EVERY]
    assert calls and all(kw["every"] == 2 for _, kw in calls), calls
    assert {"hf_snapshot", "folder_verified", "folder_to_peer"} <= {name for name, _ in calls}
    copy = unwrap_progress(streams_of(recorded)["engram-to-worker"]["stream"].commands[0])[2]  # a copy's own lines
    assert copy[copy.index("--every") + 1] == "2"
    # the progress runner's arguments, without the scripts that follow them on stdin
    shell = "\n".join(c for stream in streams for c in stream["stream"].commands)
    shell = re.sub(r"SPARKFOLD_PY_EOF.*?\nSPARKFOLD_PY_EOF", "", shell, flags=re.S)
    assert set(re.findall(r"--every (\S+)", shell)) == {"2"}


def test_a_complete_plan_is_read_once_per_run_an_incomplete_one_every_time():
    from harness import FakeHost

    from operations.facts.model import hf_plan
    args = {"python": "python3", "repo": "o/r", "revision": "main", "cache_dir": "/h/hub"}
    done = FakeHost({HfPlan: complete_plan()})
    assert hf_plan(done, **args) == hf_plan(done, **args) == complete_plan()
    assert len(done.fact_calls) == 1
    hf_plan(done, **dict(args, revision="other"))  # another revision is another plan
    assert len(done.fact_calls) == 2
    pending = FakeHost({HfPlan: complete_plan(complete=False, manifest=False)})
    hf_plan(pending, **args)
    hf_plan(pending, **args)
    assert len(pending.fact_calls) == 2  # a download of this run changes it: asked again
