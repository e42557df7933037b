"""inventory.py's checks before pyinfra connects: the site file, the ssh key files and the settings of both Sparks,
every problem named in one run even when a Spark does not answer."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from settings_factory import ROOT, group_file

from operations.settings.before_connect import (
    TITLE,
    CommandLine,
    NotReady,
    checked_entries,
    group_data_folders,
    problems_before_connect,
)
from operations.settings.site import SiteError, host_entries, read_site

LISTS = "(`python -m operations.settings` lists them)"
DEPLOY = CommandLine(scripts=frozenset({"deploy.py"}))
# group_data as pyinfra reads it (group_data() itself imports pyinfra_cli: tested in a child process below)
GROUPS = {"all": group_file("all"), "head": group_file("head"), "worker": group_file("worker")}


def closed_port() -> int:
    """A local port nothing listens on: a Spark that does not answer."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def site_text(head_extra: str = "", worker_extra: str = "", data: str = "{}", port: int | None = None) -> str:
    """Two Sparks that do not answer: the head's port is closed, the worker's address has nothing listening."""
    return (f"head: {{ssh: 127.0.0.1, ssh_port: {port or closed_port()}, ssh_user: nvidia{head_extra},\n"
            "       link: [{netdev: enp1s0f0np0, address: 192.168.100.1/24},\n"
            "              {netdev: enP2p1s0f0np0, address: 192.168.101.1/24}]}\n"
            f"worker: {{ssh: 127.0.0.2, ssh_user: nvidia{worker_extra},\n"
            "         link: [{netdev: enp1s0f0np0, address: 192.168.100.2/24},\n"
            "                {netdev: enP2p1s0f0np0, address: 192.168.101.2/24}]}\n"
            f"data: {data}\n")


def problems(tmp_path, text: str, cli: CommandLine = DEPLOY, environ: dict | None = None) -> list[str]:
    site = tmp_path / "site.yaml"
    site.write_text(text)
    return problems_before_connect(host_entries(read_site(site)), GROUPS, cli, environ or {}, tmp_path)


def test_a_clean_site_file_has_no_problem(tmp_path):
    assert problems(tmp_path, site_text()) == []


def test_a_typo_in_the_site_files_data_is_named_before_connecting(tmp_path):
    assert problems(tmp_path, site_text(data="{contxt: 524288}")) == [
        f"contxt in the site file's data is not a sparkfold setting: did you mean context? {LISTS}"]


def test_every_settings_problem_of_both_sparks_and_every_source_in_one_list(tmp_path):
    cli = CommandLine(override={"paralel": 2}, scripts=frozenset({"deploy.py"}))
    assert problems(tmp_path, site_text(head_extra=", data: {contxt: 524288}"), cli, {"SPARKFOLD_CONTEXT": "abc"}) == [
        f"head: contxt in the site file's data is not a sparkfold setting: did you mean context? {LISTS}",
        f"paralel in --data is not a sparkfold setting: did you mean parallel? {LISTS}",
        "context = 'abc' from environment variable SPARKFOLD_CONTEXT is not a whole number"]


def test_a_problem_that_depends_on_the_sparks_home_waits_for_the_check_after_connecting(tmp_path):
    # hf_cache is empty, so it lies under the ssh user's home, which only the Spark knows
    assert problems(tmp_path, site_text(data="{state_dir: /home/nvidia/.cache/huggingface/hub/state}")) == []
    assert problems(tmp_path, site_text(data="{state_dir: /srv/hf/hub/state, hf_cache: /srv/hf}")) == [
        "state_dir = '/srv/hf/hub/state' is inside hf_cache's hub folder (/srv/hf/hub), which the head exports over "
        "NFS (its hf token and API key folder would be exported): move state_dir outside /srv/hf/hub, or hf_cache "
        "elsewhere"]


def test_the_token_hf_auth_login_saved_counts_before_connecting_too(tmp_path):
    """ablit needs a token: the one huggingface_hub finds on this machine satisfies it here as after connecting."""
    site = tmp_path / "site.yaml"
    site.write_text(site_text(data="{ablit: true}"))
    entries = host_entries(read_site(site))
    without = problems_before_connect(entries, GROUPS, DEPLOY, {}, tmp_path)
    assert any(p.startswith("ablit needs your Hugging Face token") and "hf auth login" in p for p in without), without
    assert problems_before_connect(entries, GROUPS, DEPLOY, {}, tmp_path, saved_token=lambda: "hf_saved") == []


def test_an_unusable_api_key_file_is_named_before_connecting(tmp_path):
    found = problems(tmp_path, site_text(data=f"{{api_key: true, api_key_file: {tmp_path}/absent}}"))
    assert found == [f"head: api_key_file = '{tmp_path}/absent': there is no such file on this machine: write your "
                     "key into it, alone on one line, or set api_key_file to \"\" (sparkfold then makes a key on the "
                     "head)"]


def test_checked_entries_asks_huggingface_hub_for_the_saved_token(tmp_path, monkeypatch):
    from operations.settings import before_connect, sources

    seen = {}
    monkeypatch.setattr(before_connect, "problems_before_connect",
                        lambda *args, saved_token=None: seen.setdefault("saved", saved_token) and [])
    # pyinfra's command line and group_data reader import pyinfra_cli (gevent): not in this process
    monkeypatch.setattr(before_connect, "command_line", lambda: DEPLOY)
    monkeypatch.setattr(before_connect, "group_data", lambda folders: GROUPS)
    site = tmp_path / "site.yaml"
    site.write_text(site_text())
    checked_entries(environ={"SPARKFOLD_SITE": str(site)})
    assert seen["saved"] is sources.saved_hf_token


@pytest.mark.parametrize("script", ["status.py", "logs.py", "stop.py", "rollback.py"])
def test_the_tools_that_go_on_despite_settings_problems_are_not_stopped_by_one(tmp_path, script):
    assert problems(tmp_path, site_text(data="{contxt: 1}"), CommandLine(scripts=frozenset({script}))) == []


@pytest.mark.parametrize("script", ["deploy.py", "restart.py", "status.py"])
def test_a_missing_ssh_key_file_is_named_with_the_fix_for_every_script(tmp_path, script):
    key, port = tmp_path / "id_spark", closed_port()
    text = site_text(head_extra=f", ssh_key: {key}", port=port)
    assert problems(tmp_path, text, CommandLine(scripts=frozenset({script}))) == [
        f"head: ssh_key = '{key}' (from the site file) is no file on this machine: make the key with "
        f"`ssh-keygen -t ed25519 -f {key}` and put it on the Spark with `ssh-copy-id -i {key} -p {port} "
        "nvidia@127.0.0.1`, or set ssh_key to the private key you use (without ssh_key, your ssh agent and "
        "~/.ssh/config are used)"]
    key.write_text("a key")
    assert problems(tmp_path, text, CommandLine(scripts=frozenset({script}))) == []


def test_a_key_given_with_pyinfras_key_option_is_checked_for_both_sparks(tmp_path):
    cli = CommandLine(override={"ssh_key": "/no/such/key"}, scripts=frozenset({"status.py"}))
    found = problems(tmp_path, site_text(), cli)
    assert [p.split(" is no file")[0] for p in found] == [
        "head: ssh_key = '/no/such/key' (from --data or --key)",
        "worker: ssh_key = '/no/such/key' (from --data or --key)"]
    assert "`ssh-copy-id -i /no/such/key nvidia@127.0.0.2`" in found[1]  # port 22: no -p


def test_a_relative_key_below_the_working_folder_is_found_as_pyinfra_finds_it(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "spark").write_text("a key")
    assert problems(tmp_path, site_text(head_extra=", ssh_key: keys/spark")) == []


def test_every_site_file_problem_in_one_run(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("head: {ssh: a, ssh_usr: nvidia, link: [{netdev: x}]}\n"
                    "worker: {ssh: b, ssh_port: 0, link: [{netdev: 'eth 1', address: 10.0.0.2/24}]}\nnodes: 1\n")
    with pytest.raises(SiteError) as exc:
        read_site(site)
    assert str(exc.value).splitlines() == [
        f"the site file {site} needs fixing (sparks.example.yaml shows the shape):",
        "  - unknown top-level key(s) ['nodes']; expected head, worker, data",
        "  - head: unknown key(s) ['ssh_usr'] (ssh_usr: did you mean ssh_user?); allowed: ['data', 'link', 'name', "
        "'reach_from_head', 'ssh', 'ssh_key', 'ssh_port', 'ssh_user']",
        "  - head.link[0] needs netdev and address",
        "  - worker.ssh_port must be a port number (1-65535)",
        "  - worker.link[0].netdev = 'eth 1' must be an interface name (letters, digits, _ . -, at most 15, not "
        "starting with - or .; `ip -br link` lists them)"]


def test_a_yaml_error_names_the_file_line_column_and_fix(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("head:\n  ssh: a\n\tlink: []\n")
    with pytest.raises(SiteError) as exc:
        read_site(site)
    assert str(exc.value) == (
        f"{site} line 3, column 1: not valid YAML: found character '\\t' that cannot start any token. Fix the file "
        "there: indent with spaces (no tabs), close every { and [, quote a value holding ': ' or ' #'; "
        "sparks.example.yaml shows the shape")


def test_a_yaml_error_inside_a_mapping_says_where_the_mapping_starts(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("head: {ssh: a\n")
    with pytest.raises(SiteError) as exc:
        read_site(site)
    assert str(exc.value) == (
        f"{site} line 2, column 1: not valid YAML: expected ',' or '}}', but got '<stream end>' (while parsing a flow "
        "mapping that starts at line 1, column 7). Fix the file there: indent with spaces (no tabs), close every { "
        "and [, quote a value holding ': ' or ' #'; sparks.example.yaml shows the shape")


def test_sparkfold_site_naming_a_missing_file_names_it_and_the_fix(tmp_path):
    missing = tmp_path / "mine.yaml"
    with pytest.raises(NotReady) as exc:
        checked_entries(ROOT, {"SPARKFOLD_SITE": str(missing)})
    assert str(exc.value) == (
        f"no site file at {missing} (SPARKFOLD_SITE names it): copy sparks.example.yaml there and fill in your "
        "Sparks' ssh targets and CX7 netdevs/addresses, or point SPARKFOLD_SITE at your site file (unset, sparks.yaml "
        "is read)")


def test_a_site_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(SiteError) as exc:
        read_site(tmp_path)  # a folder
    assert str(exc.value) == (f"cannot read the site file {tmp_path}: Is a directory: it must be a readable text "
                              "file (copy sparks.example.yaml)")


def test_group_data_folders_in_pyinfras_order(tmp_path):
    assert group_data_folders(ROOT, tmp_path, ("/etc/gd",)) == [str(tmp_path / "group_data"),
                                                                 str(ROOT / "group_data"), "/etc/gd"]
    assert group_data_folders(ROOT, ROOT) == [str(ROOT / "group_data")]


def test_pyinfras_command_line_and_group_data_are_read_as_pyinfra_reads_them(tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "head.py").write_text("import os\ncontext = 2**19\n_private = 1\n")
    # pyinfra_cli patches gevent into the process that imports it: a child of its own
    script = f"""
import json, types, click
from pyinfra.context import ctx_state
from operations.settings.before_connect import CommandLine, command_line, group_data
params = {{"data": ("context=524288", 'extra_serve_args=["--top-k", "20"]', "served_name=x=y"), "ssh_key": "~/k",
          "ssh_port": 2222, "ssh_user": None, "group_data": ("/etc/gd",), "operations": ("/srv/sf/deploy.py",)}}
with click.Context(click.Command("pyinfra")) as context:
    context.params.update(params)
    cli = command_line()
with ctx_state.use(types.SimpleNamespace(current_exec_filename=None)):  # as pyinfra's CLI has one
    groups = group_data([{str(ROOT / "group_data")!r}, {str(tmp_path / "group_data")!r}])
print(json.dumps([cli.override, cli.group_data_folders, sorted(cli.scripts), command_line() == CommandLine(),
                  groups["head"], groups["all"]["context"]]))
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    override, folders, scripts, empty_outside, head, context = json.loads(run.stdout.strip().splitlines()[-1])
    assert override == {"context": 524288, "extra_serve_args": ["--top-k", "20"], "served_name": "x=y",
                        "ssh_key": "~/k", "ssh_port": 2222}
    assert folders == ["/etc/gd"] and scripts == ["deploy.py"] and empty_outside is True
    assert head == {"role": "head", "rank": 0, "disk_need_gb": 505, "context": 524288, "_private": 1}  # no `os`
    assert context == 1048576


def run_pyinfra(site: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPARKFOLD_")}
    return subprocess.run([sys.executable, "-m", "pyinfra", "inventory.py", *args], cwd=ROOT,
                          env={**base, **(env or {}), "SPARKFOLD_SITE": str(site), "PYINFRA_PROGRESS": "off"},
                          capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_pyinfra_names_the_typo_and_stops_before_connecting(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(site_text(data="{contxt: 524288}"))
    run = run_pyinfra(site, "deploy.py", "--dry")
    assert run.returncode == 2, run.stderr
    assert run.stderr.endswith(f"sparkfold: {TITLE}:\n  - contxt in the site file's data is not a sparkfold setting: "
                               f"did you mean context? {LISTS}\n"), run.stderr
    assert "Connecting to hosts" not in run.stderr + run.stdout


def test_pyinfra_names_a_missing_key_file_instead_of_its_traceback(tmp_path):
    site, key = tmp_path / "site.yaml", tmp_path / "id_spark"
    site.write_text(site_text(head_extra=f", ssh_key: {key}"))
    run = run_pyinfra(site, "status.py", "-y")
    assert run.returncode == 2 and f"  - head: ssh_key = '{key}' (from the site file) is no file on this machine" in (
        run.stderr), run.stderr
    assert "greenlet" not in run.stderr and "Traceback" not in run.stderr


def test_the_simulated_pairs_site_file_passes_before_connecting(tmp_path):
    # the e2e suite deploys with it: a false refusal here would stop every e2e run
    import yaml

    from tests.sim import sim
    site, key = sim.site_data(), tmp_path / "controller"
    key.write_text("a key")
    for role in ("head", "worker"):
        site[role]["ssh_key"] = str(key)
    assert problems(tmp_path, yaml.safe_dump(site)) == []


# ---- the site file's problems and the settings' in one run; the ssh user; --limit; a Spark that does not answer ----

def checked(tmp_path, monkeypatch, text: str, cli: CommandLine = DEPLOY, environ: dict | None = None, run=None):
    """checked_entries as inventory.py calls it, with pyinfra's command line and group_data given (importing
    pyinfra_cli would patch gevent into this process) and ssh -G answered by `run`."""
    from operations.settings import before_connect
    monkeypatch.setattr(before_connect, "command_line", lambda: cli)
    monkeypatch.setattr(before_connect, "group_data", lambda folders: GROUPS)
    monkeypatch.setattr(before_connect, "hint_unanswered", lambda sparks: None)
    site = tmp_path / "site.yaml"
    site.write_text(text)
    return checked_entries(ROOT, {"SPARKFOLD_SITE": str(site), **(environ or {})}, run=run)


def test_the_site_files_problems_and_the_settings_problems_in_one_run(tmp_path, monkeypatch):
    text = site_text(head_extra=", ssh_usr: nvidia", data="{contxt: 524288}") + "heads: {}\n"
    with pytest.raises(NotReady) as exc:
        checked(tmp_path, monkeypatch, text, environ={"CONTEXT": "abc"})
    assert str(exc.value).splitlines() == [
        f"the site file {tmp_path / 'site.yaml'} needs fixing (sparks.example.yaml shows the shape):",
        "  - unknown top-level key(s) ['heads'] (heads: did you mean head?); expected head, worker, data",
        "  - head: unknown key(s) ['ssh_usr'] (ssh_usr: did you mean ssh_user?); allowed: ['data', 'link', 'name', "
        "'reach_from_head', 'ssh', 'ssh_key', 'ssh_port', 'ssh_user']",
        f"{TITLE}:",
        f"  - contxt in the site file's data is not a sparkfold setting: did you mean context? {LISTS}",
        "  - context = 'abc' from environment variable CONTEXT is not a whole number; if CONTEXT is set for another "
        "program, run with `env -u CONTEXT` or give SPARKFOLD_CONTEXT, which wins"]


class FakeSsh:
    """`ssh -G` as a test wants it to answer: the user and port ssh would resolve for a host (~/.ssh/config)."""

    def __init__(self, user="spark", port=22, returncode=0):
        self.user, self.port, self.returncode, self.asked = user, port, returncode, []

    def __call__(self, argv):
        self.asked.append(list(argv))
        port = argv[argv.index("-p") + 1] if "-p" in argv else self.port
        out = f"user {self.user}\nhostname {argv[-1]}\nport {port}\n" if self.returncode == 0 else ""
        return subprocess.CompletedProcess(argv, self.returncode, out, "ssh: bad configuration" if out == "" else "")


def test_a_spark_without_ssh_user_gets_the_user_ssh_would_log_in_as(tmp_path, monkeypatch):
    ssh = FakeSsh(user="dgx", port=2200)
    text = site_text(port=2222).replace(", ssh_user: nvidia", "", 2)
    entries = checked(tmp_path, monkeypatch, text, cli=CommandLine(scripts=frozenset({"status.py"})), run=ssh)
    assert ssh.asked == [["ssh", "-G", "-p", "2222", "127.0.0.1"], ["ssh", "-G", "127.0.0.2"]]
    assert (entries["head"][1]["ssh_user"], entries["head"][1]["ssh_port"]) == ("dgx", 2222)
    assert (entries["worker"][1]["ssh_user"], entries["worker"][1]["ssh_port"]) == ("dgx", 2200)  # ssh's own port


def test_a_user_the_site_file_or_pyinfras_user_option_gives_is_kept(tmp_path, monkeypatch):
    ssh = FakeSsh(user="dgx")
    cli = CommandLine(override={"ssh_user": "ops"}, scripts=frozenset({"status.py"}))
    entries = checked(tmp_path, monkeypatch, site_text().replace(", ssh_user: nvidia", "", 1), cli=cli, run=ssh)
    assert ssh.asked == [] and "ssh_user" not in entries["head"][1]  # pyinfra applies --user itself
    entries = checked(tmp_path, monkeypatch, site_text(), cli=CommandLine(scripts=frozenset({"status.py"})), run=ssh)
    assert ssh.asked == [] and entries["worker"][1]["ssh_user"] == "nvidia"


def test_without_an_answer_from_ssh_the_user_is_refused_before_connecting(tmp_path, monkeypatch):
    port = closed_port()
    with pytest.raises(NotReady) as exc:
        checked(tmp_path, monkeypatch, site_text(port=port).replace(", ssh_user: nvidia", "", 2),
                run=FakeSsh(returncode=255))
    assert str(exc.value).splitlines()[1:] == [
        f"  - head: no ssh_user is set and `ssh -G -p {port} 127.0.0.1` failed (exit 255: ssh: bad configuration): "
        "set head.ssh_user in the site file to the login on that Spark",
        "  - worker: no ssh_user is set and `ssh -G 127.0.0.2` failed (exit 255: ssh: bad configuration): set "
        "worker.ssh_user in the site file to the login on that Spark"]


def test_ssh_on_path_is_asked(tmp_path, monkeypatch):
    """The real runner: an `ssh` on PATH that prints what `ssh -G` prints."""
    from operations.settings.ssh_login import ssh_config_login
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = -G ] && printf "user fromconfig\\nport 2022\\nhostname %s\\n" "$2"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert ssh_config_login("spark-a", None) == ("fromconfig", 2022)


@pytest.mark.parametrize("cli, line", [
    (CommandLine(scripts=frozenset({"deploy.py"}), limit=("head",)),
     "--limit is not used with deploy.py: the two Sparks are one server; run it without --limit"),
    (CommandLine(scripts=frozenset({"stop.py"}), limit=("127.0.0.2",)),
     "--limit is not used with stop.py: the two Sparks are one server; run it without --limit"),
    (CommandLine(scripts=frozenset({"rollback.py"}), exclude=("127.0.0.*",)),
     "--exclude is not used with rollback.py: the two Sparks are one server; run it without --exclude"),
    (CommandLine(scripts=frozenset({"deploy.py"}), limit=("head", "worker")), None),
    (CommandLine(scripts=frozenset({"restart.py"}), limit=("inventory",)), None),
    (CommandLine(scripts=frozenset({"status.py"}), limit=("head",)), None),
])
def test_a_limit_that_leaves_a_spark_out_is_refused_before_connecting(tmp_path, monkeypatch, cli, line):
    if line is None:
        assert set(checked(tmp_path, monkeypatch, site_text(), cli=cli)) == {"head", "worker"}
    else:
        with pytest.raises(NotReady) as exc:
            checked(tmp_path, monkeypatch, site_text(), cli=cli)
        assert str(exc.value) == line


def test_pyinfra_refuses_the_limit_though_no_spark_answers(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(site_text())
    run = run_pyinfra(site, "deploy.py", "--limit", "head", "-y")
    assert run.returncode == 2 and run.stderr.endswith(
        "sparkfold: --limit is not used with deploy.py: the two Sparks are one server; run it without --limit\n"), (
        run.stderr)
    assert "Could not connect" not in run.stderr + run.stdout


def test_a_spark_that_does_not_answer_is_named_with_the_ssh_line_that_shows_why(tmp_path):
    site, port = tmp_path / "site.yaml", closed_port()
    site.write_text(site_text(port=port))
    run = run_pyinfra(site, "deploy.py", "-y")
    assert run.returncode != 0
    assert f"sparkfold: `ssh -p {port} nvidia@127.0.0.1 true` shows why 127.0.0.1 does not answer" in run.stderr, (
        run.stderr)


def test_a_hub_timeout_huggingface_hub_cannot_read_is_the_only_line(tmp_path):
    """huggingface_hub int()s its timeouts as it is imported: asked for the saved token, it would fail with a
    ValueError that read as a token problem."""
    site = tmp_path / "site.yaml"
    site.write_text(site_text())
    run = run_pyinfra(site, "deploy.py", "--dry", env={"HF_HUB_DOWNLOAD_TIMEOUT": "abc"})
    assert run.returncode == 2 and run.stderr.endswith(
        f"sparkfold: {TITLE}:\n  - HF_HUB_DOWNLOAD_TIMEOUT = 'abc' must be a whole number of seconds from 1 to 86400: "
        "huggingface_hub cannot even start with it (on this machine, which then cannot read your saved token, nor on "
        "the head)\n"), run.stderr
