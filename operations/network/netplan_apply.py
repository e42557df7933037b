"""netplan apply that cannot strand a Spark, not even through a reboot: the new files live under /run/netplan
(tmpfs) until the apply is confirmed, a revert is armed on the Spark itself (a transient systemd timer), the apply
runs detached, and only a *new* ssh connection from this machine, opened after it saw the apply finished, confirms
it. /etc/netplan changes only then.

netplan reads /lib/netplan, /etc/netplan and /run/netplan, and a file under /run/netplan shadows (completely
replaces) the file of the same name under /etc/netplan (netplan-generate(8), "Handling multiple files"). So a file
staged there is what `netplan apply` uses, and a power cycle during the window (what people do with a Spark that
stopped answering) boots /etc/netplan's files: the unconfirmed config is gone with the tmpfs.

Sequence inside the netplan operation, per apply (a root-only folder per apply under NETPLAN_APPLY_DIR):
1. prepare: revert.sh and promote.sh written, and each changed file's new text uploaded to <dir>/new/<n> (a file
   moved aside gets a shadow that configures nothing);
2. arm: `systemd-run --on-active=<link_rollback_s>s` runs revert.sh unless the apply was confirmed by then;
3. stage: the new texts copied to /run/netplan under their file names;
4. apply: `netplan generate && netplan apply`, detached (setsid), the boot id and its exit status written to files,
   so a cut management path cannot leave the deploy waiting on a dead channel;
5. confirm (on this machine): fresh ssh connections (each a new connector, new TCP session and authentication)
   ask whether the apply finished, with no side effect, until one says it did; then another one, opened only after
   that answer, checks the management address, claims the decision and runs promote.sh, which writes the files to
   /etc/netplan (other files backed up beside themselves) and drops them from /run/netplan. Every attempt has a time
   limit, so a connection whose packets the new config drops counts as unreachable. If none succeeds in time, the
   Spark reverts by itself and this host fails with what happened and what to check.

revert.sh and the confirmation claim the decision with `ln -s revert|confirm <dir>/decided` (atomic, and it says who
won): whichever comes second does nothing, so a late confirmation never keeps a configuration the revert already
undid. Both scripts finish what an interrupted run of theirs left, so the next run settles an apply that a killed
run or a reboot left undecided or half done (settle_command; NetplanState lists them).
"""

from __future__ import annotations

import posixpath
import secrets
import time
from io import StringIO
from shlex import quote
from typing import Any, TypedDict

import gevent
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand

from operations.layout import BOOT_ID, NETPLAN_APPLY_DIR, NETPLAN_REVERT_UNIT, NETPLAN_STAGE_DIR
from operations.settings.shapes import CONFIRM_WAIT_APPLY_S
from operations.util.checks import function_failed

MARK = "sparkfold-confirm="  # the confirmation's verdict on stderr
SEEN = "sparkfold-applied="  # applied_check's line on stdout: the apply finished, with this exit status
APPLIED_POLL_S = 5  # applied_check waits this long on the Spark for the apply before it answers "not yet"
REPLY_S = 20  # a command's reply (pyinfra's _timeout): the check takes APPLIED_POLL_S, the claim a second or a revert
SETUP_S = 20  # on top of REPLY_S: a new connection's TCP, handshake and authentication, and its channel's opening
KEEP_DAYS = 30  # apply directories older than this are pruned when a new one is made


class Change(TypedDict):
    """One netplan file an apply changes."""

    path: str  # the file under /etc/netplan
    text: str | None  # what it holds once the apply is confirmed; None: moved aside to its backup
    mode: str  # octal, the mode it is written with
    backup: bool  # the file as it was is kept beside it (backup_path)


class NetplanNotConfirmed(Exception):
    """The apply was not confirmed over a new ssh connection; the message says what the Spark does about it.
    netplan_confirmed turns it into this Spark's failure (a FunctionCommand that raises prints a traceback)."""


def new_apply_dir() -> str:
    return f"{NETPLAN_APPLY_DIR}/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def backup_path(path: str, apply_dir: str) -> str:
    """<path>.sparkfold-backup-<the apply's timestamp>: one name per apply, so a promotion run again keeps the
    first backup instead of making another of the file it already wrote."""
    return f"{path}.sparkfold-backup-{'-'.join(posixpath.basename(apply_dir).split('-')[:2])}"


def staged_path(path: str, stage_dir: str = NETPLAN_STAGE_DIR) -> str:
    return f"{stage_dir}/{posixpath.basename(path)}"


def shadow_text(change: Change) -> str:
    """What the apply stages for a change: its new text, or for a file moved aside a file that configures nothing
    (real netplan generate reads it as no network definitions), so that file is out of the apply too."""
    if change["text"] is not None:
        return change["text"]
    return (f"# sparkfold: {change['path']} moves aside when this apply is confirmed; until then this file hides it\n"
            "network:\n  version: 2\n")


def revert_script(apply_dir: str, changes: list[Change], seconds: int, stage_dir: str = NETPLAN_STAGE_DIR) -> str:
    """revert.sh: drop the apply's files from the stage folder and, when the apply ran in this boot, apply
    /etc/netplan's files again (after a reboot the network already runs them). Claims the decision first, or
    finishes a revert that was cut short."""
    staged = " ".join(quote(staged_path(c["path"], stage_dir)) for c in changes)
    lines = ["#!/bin/sh",
             f"# sparkfold: undo the netplan apply of {apply_dir} unless it was confirmed within {seconds} s. Its",
             f"# files live only under {stage_dir} until then (a reboot drops them too).",
             f"d={quote(apply_dir)}",
             'if ! ln -s revert "$d/decided" 2>/dev/null; then',
             "  # decided before: by the confirmation (kept), or by a revert that was cut short (finished here)",
             '  { [ "$(readlink "$d/decided")" = revert ] && [ ! -e "$d/reverted" ]; } || exit 0',
             "fi",
             "{",
             '  echo "reverting at $(date -Is)"']
    if staged:
        lines.append(f"  rm -f {staged}")
    lines += [f'  if [ "$(cat "$d/boot" 2>/dev/null)" = "$(cat {BOOT_ID})" ]; then',
              "    netplan generate && netplan apply",
              '    echo "netplan apply after the revert: exit $?"',
              "  else",
              '    echo "the apply did not run in this boot: the network already runs the files in /etc/netplan"',
              "  fi",
              '} >>"$d/revert.log" 2>&1',
              'date -Is >"$d/reverted"', ""]
    return "\n".join(lines)


def promote_script(apply_dir: str, changes: list[Change], stage_dir: str = NETPLAN_STAGE_DIR) -> str:
    """promote.sh: write a confirmed apply's files to /etc/netplan (each through a temporary name and a rename;
    a backup of each migrated file first, kept from a first attempt), then drop them from the stage folder. Run
    again, it finishes what an interrupted run left; it refuses an apply that was not confirmed."""
    lines = ["#!/bin/sh",
             f"# sparkfold: write the confirmed netplan apply of {apply_dir} to its files, then drop them from",
             f"# {stage_dir}. Safe to run again.",
             f"d={quote(apply_dir)}",
             '[ "$(readlink "$d/decided")" = confirm ] || { echo "$d is not confirmed" >&2; exit 1; }',
             '[ -e "$d/confirmed" ] && exit 0',
             "set -e"]
    for n, change in enumerate(changes):
        path, backup = quote(change["path"]), quote(backup_path(change["path"], apply_dir))
        if change["text"] is None:
            lines.append(f"[ ! -e {path} ] || [ -e {backup} ] || mv {path} {backup}")
            continue
        if change["backup"]:
            lines.append(f"[ ! -e {path} ] || [ -e {backup} ] || cp -p {path} {backup}")
        folder, name = posixpath.split(change["path"])
        temp = quote(f"{folder}/.{name}.sparkfold-new")  # not *.yaml: netplan never reads it
        lines += [f'install -m {quote(change["mode"])} "$d/new/{n}" {temp}', f"mv -f {temp} {path}"]
    if changes:
        lines.append("rm -f " + " ".join(quote(staged_path(c["path"], stage_dir)) for c in changes))
    lines += ['date -Is >"$d/confirmed"', ""]
    return "\n".join(lines)


def prepare_commands(apply_dir: str, changes: list[Change], seconds: int, stage_dir: str = NETPLAN_STAGE_DIR):
    """The apply's folder (root only: netplan files can hold secrets) with revert.sh, promote.sh and each change's
    staged text in new/<n> (uploaded, never on a command line)."""
    parts = [f"umask 077 && mkdir -p {quote(apply_dir + '/new')}",
             f"printf '%s' {quote(revert_script(apply_dir, changes, seconds, stage_dir))} > "
             f"{quote(apply_dir + '/revert.sh')}",
             f"printf '%s' {quote(promote_script(apply_dir, changes, stage_dir))} > {quote(apply_dir + '/promote.sh')}",
             # old apply directories are ours alone; a month of history is plenty to read what happened
             f"find {quote(posixpath.dirname(apply_dir))} -mindepth 1 -maxdepth 1 -type d -mtime +{KEEP_DAYS} "
             "-exec rm -rf {} +"]
    yield StringCommand(" && ".join(parts))
    for n, change in enumerate(changes):
        yield FileUploadCommand(StringIO(shadow_text(change)), f"{apply_dir}/new/{n}")


def arm_command(apply_dir: str, seconds: int) -> StringCommand:
    """The revert, armed on the Spark: it fires even if this machine, the network or the ssh session is gone."""
    unit = f"{NETPLAN_REVERT_UNIT}-{apply_dir.rsplit('/', 1)[-1]}"
    return StringCommand(f"systemd-run --quiet --unit={quote(unit)} --on-active={int(seconds)}s "
                         f"/bin/sh {quote(apply_dir + '/revert.sh')}")


def stage_command(apply_dir: str, changes: list[Change], stage_dir: str = NETPLAN_STAGE_DIR) -> StringCommand:
    """The new texts under the stage folder, mode 600 (netplan warns about a file others can read)."""
    parts = [f"mkdir -p {quote(stage_dir)}"]
    parts += [f"install -m 600 {quote(f'{apply_dir}/new/{n}')} {quote(staged_path(c['path'], stage_dir))}"
              for n, c in enumerate(changes)]
    return StringCommand(" && ".join(parts))


def apply_command(apply_dir: str) -> StringCommand:
    """netplan generate && apply, detached from this ssh session; the boot it ran in lands in <dir>/boot (the revert
    re-applies only in that boot), its exit status in <dir>/applied."""
    folder = quote(apply_dir)
    inner = (f"netplan generate && netplan apply; echo $? > {folder}/applied.tmp && "
             f"mv {folder}/applied.tmp {folder}/applied")
    return StringCommand(f"cat {BOOT_ID} > {folder}/boot; "
                         f"setsid sh -c {quote(inner)} > {folder}/apply.log 2>&1 < /dev/null &")


def settle_command(apply_dir: str, decision: str) -> StringCommand:
    """For an apply an interrupted run or a reboot left (NetplanState's "undecided"): a confirmed one is written to
    /etc/netplan, any other undone."""
    return StringCommand(f"sh {quote(apply_dir + ('/promote.sh' if decision == 'confirm' else '/revert.sh'))}")


def applied_check(apply_dir: str, give_up: bool = False) -> str:
    """Run over a polling connection: wait up to APPLIED_POLL_S for the apply to finish and print SEEN<its exit
    status>, or print nothing. Side-effect free, so a connection opened before the apply may run it; with give_up
    (the apply has had CONFIRM_WAIT_APPLY_S) an apply still running is reverted: MARK4 (reverting needs no proof)."""
    folder = quote(apply_dir)
    script = (f"i=0; while [ ! -e {folder}/applied ] && [ $i -lt {APPLIED_POLL_S * 2} ]; do i=$((i+1)); sleep 0.5; "
              f"done; if [ -e {folder}/applied ]; then echo {SEEN}$(cat {folder}/applied); exit 0; fi")
    if give_up:
        script += (f"; echo 'netplan apply did not finish within {CONFIRM_WAIT_APPLY_S} s' >&2; "
                   f"sh {folder}/revert.sh >&2; echo {MARK}4 >&2; exit 1")
    return script


def confirm_script(apply_dir: str, mgmt_dev: str | None, mgmt_ip: str | None) -> str:
    """Run over the claiming connection, opened after applied_check reported the apply finished: revert now if it
    failed or lost the management address, else claim the decision and write the files to /etc/netplan (exit 0).
    On failure the last stderr line is MARK<n>: 2 apply failed, 3 management address lost, 5 the automatic revert
    already ran, 6 writing the confirmed files failed (no exit code reaches pyinfra's caller); 4 (apply hung) is
    applied_check's."""
    folder = quote(apply_dir)
    # never claims before the apply finished, even if this machine were wrong about it: that proves nothing
    script = (f"[ -e {folder}/applied ] || {{ echo 'netplan apply has not finished: nothing decided' >&2; exit 1; }}; "
              f"rc=$(cat {folder}/applied); if [ \"$rc\" != 0 ]; then cat {folder}/apply.log >&2; "
              f"sh {folder}/revert.sh; "
              f"echo {MARK}2 >&2; exit 1; fi; ")
    if mgmt_dev and mgmt_ip:
        script += (f"ip -4 -o addr show dev {quote(mgmt_dev)} | grep -qF {quote(f' inet {mgmt_ip}/')} || "
                   f"{{ sh {folder}/revert.sh; echo {MARK}3 >&2; exit 1; }}; ")
    # claimed now, or by this confirmation before (run again, it only finishes promote.sh)
    script += (f"{{ ln -s confirm {folder}/decided 2>/dev/null || [ \"$(readlink {folder}/decided)\" = confirm ]; }} "
               f"|| {{ cat {folder}/reverted >&2; echo {MARK}5 >&2; exit 1; }}; "
               f"sh {folder}/promote.sh >&2 || {{ echo {MARK}6 >&2; exit 1; }}")
    return script


def _why(code: int, apply_dir: str, mgmt: str, stderr: str) -> str:
    said = f" ({stderr.strip()})" if stderr.strip() else ""
    return {
        2: f"netplan apply failed{said}; the previous netplan files are back and applied",
        3: f"after netplan apply the management interface lost {mgmt}; the previous netplan files are back and "
           "applied: check that link_rails names only the CX7 netdevs",
        4: f"netplan apply did not finish within {CONFIRM_WAIT_APPLY_S} s; the previous netplan files are back",
        5: f"the Spark's automatic revert ran before the confirmation{said}: its network is as it was before",
        6: f"the apply was confirmed but its files could not all be written to /etc/netplan{said}; the Spark runs "
           "them until it reboots, and the next run finishes writing them",
    }.get(code, f"the confirmation failed (exit {code}){said}") + f" (details in {apply_dir} on the Spark)"


SUDO_ARGUMENTS = ("_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env")


class SudoArguments(dict):
    """Shown as its names only: pyinfra prints a Python callback's arguments (--dry, -vvv), and this may hold the
    sudo password."""

    def __repr__(self) -> str:
        return f"<sudo: {', '.join(sorted(self)) or 'defaults'}>"


def sudo_arguments(host) -> SudoArguments:
    """The sudo settings of the operation being planned (a sudo password given to pyinfra, say), for the new
    connection's command: it runs at execute time, when pyinfra no longer holds them for us."""
    given = host.current_op_global_arguments or {}
    return SudoArguments({k: given[k] for k in SUDO_ARGUMENTS if given.get(k)})


class Unanswered(Exception):
    """A new connection could not be opened, or its command's reply did not come in time: "not reachable"."""

    def __init__(self, why: str, sent: bool):
        super().__init__(why)
        self.sent = sent  # the command went out (it may have run on the Spark)


def run_over_new_connection(state, host, script: str, sudo: dict) -> tuple[bool, Any]:
    """Open a new connection to the host (new TCP session and authentication), run script as root, close it. Every
    step is bounded, so a connection whose packets are dropped after it was established raises Unanswered."""
    connector = host.connector_cls(state, host)
    sent = False
    # pyinfra's _timeout bounds only the reading of the output: paramiko waits with no (or an hour's) limit to
    # authenticate, open the channel and read the exit status, so the whole attempt is bounded too (pyinfra runs
    # under gevent's patching, where this interrupts paramiko's waits)
    limit = gevent.Timeout(SETUP_S + REPLY_S)
    limit.start()
    try:
        try:
            connector.connect()
        except Exception as exc:  # ConnectError and whatever the transport raises: all mean "not reachable yet"
            raise Unanswered(str(exc) or exc.__class__.__name__, sent) from None
        sent = True
        return connector.run_shell_command(StringCommand(script), _sudo=True, _timeout=REPLY_S, **sudo)
    except TimeoutError:  # pyinfra's _timeout
        raise Unanswered(f"no reply within {REPLY_S} s", sent) from None
    except gevent.Timeout as exc:
        if exc is not limit:
            raise
        raise Unanswered(f"no answer within {SETUP_S + REPLY_S} s", sent) from None
    finally:
        limit.close()
        client = getattr(connector, "client", None)
        if client is not None:
            client.close()


def confirm_over_new_connection(state, host, apply_dir: str, mgmt_dev: str | None, mgmt_ip: str | None,
                                seconds: int, sudo: dict | None = None) -> None:
    """On this machine, after the detached apply: confirm over a connection opened after the apply was seen finished
    (the one pyinfra holds was opened before the apply and proves nothing). Raises NetplanNotConfirmed.

    Two new connections at least, in order: polling ones run applied_check (no side effect) until one reports that
    the apply finished; only then is another opened, and it alone runs the claim. A connection opened earlier, even
    one opened a moment before the apply cut the management path, can never claim. (A claim script that checked
    its own start against `applied` could not see when its connection was established.)"""
    margin = min(15, max(5, seconds // 3))  # the confirmation itself must finish before the revert fires
    start = time.monotonic()
    deadline = start + seconds - margin
    sudo = dict(sudo or {})
    last_error, claim_unanswered, seen = "no attempt", False, False
    while time.monotonic() < deadline:
        script = (confirm_script(apply_dir, mgmt_dev, mgmt_ip) if seen else
                  applied_check(apply_dir, give_up=time.monotonic() - start >= CONFIRM_WAIT_APPLY_S))
        try:
            ok, output = run_over_new_connection(state, host, script, sudo)
        except Unanswered as exc:
            last_error = str(exc)
            claim_unanswered = claim_unanswered or (seen and exc.sent)
            time.sleep(2)
            continue
        if not ok:
            said = [line for line in output.stderr_lines if not line.startswith(MARK)]
            codes = [line[len(MARK):] for line in output.stderr_lines if line.startswith(MARK)]
            code = int(codes[-1]) if codes and codes[-1].isdigit() else 1
            raise NetplanNotConfirmed(f"{host.name}: {_why(code, apply_dir, str(mgmt_ip), ' '.join(said))}")
        if seen:
            return
        seen = any(line.startswith(SEEN) for line in output.stdout_lines)
    sent = (f" A confirmation was sent but its answer never came: if it reached the Spark, the Spark kept the apply "
            f"(`readlink {apply_dir}/decided` says which)." if claim_unanswered else "")
    raise NetplanNotConfirmed(
        f"{host.name}: no new ssh connection succeeded within {seconds - margin} s after netplan apply "
        f"(last error: {last_error}). The Spark puts its previous netplan files back by itself "
        f"{seconds} s after the apply, or when it boots ({apply_dir}/revert.sh, log in "
        f"{apply_dir}/revert.log; /etc/netplan was not changed). Check "
        "from a console that the management network is up, that link_rails names only the CX7 "
        f"netdevs and that their subnets are the link's own, then re-run.{sent}")


def netplan_confirmed(state, host, apply_dir: str, mgmt_dev: str | None, mgmt_ip: str | None, seconds: int,
                      sudo: dict | None = None) -> bool:
    """The guarded apply's last command: confirmed over a new connection, or this Spark failed with why and what the
    Spark does about it (the run stops there)."""
    try:
        confirm_over_new_connection(state, host, apply_dir, mgmt_dev, mgmt_ip, seconds, sudo)
    except NetplanNotConfirmed as exc:
        return function_failed("netplan apply", str(exc))
    return True


def guarded_apply(apply_dir: str, changes: list[Change], seconds: int, mgmt_dev: str | None,
                  mgmt_ip: str | None, sudo: dict | None = None, stage_dir: str = NETPLAN_STAGE_DIR) -> list:
    """Every command of one guarded apply, in order: prepare (folder, scripts, uploads), arm, stage, apply, confirm.
    The revert is armed before anything is staged, so a run killed at any point after that leaves a Spark that
    drops the staged files by itself; a reboot drops them anyway."""
    return [*prepare_commands(apply_dir, changes, seconds, stage_dir), arm_command(apply_dir, seconds),
            *([stage_command(apply_dir, changes, stage_dir)] if changes else []), apply_command(apply_dir),
            FunctionCommand(netplan_confirmed, (apply_dir, mgmt_dev, mgmt_ip, int(seconds)),
                            {"sudo": SudoArguments(sudo or {})})]
