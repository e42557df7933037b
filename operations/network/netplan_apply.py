"""netplan apply that cannot strand a Spark: the previous files are kept, a revert is armed on the Spark itself
(a transient systemd timer), the apply runs detached, and only a *new* ssh connection from this machine confirms it.

Sequence inside the netplan operation, per apply (a directory per apply under NETPLAN_APPLY_DIR):
1. snapshot: copies of the netplan files this apply touches, and revert.sh that puts them back and re-applies;
2. the migrations and our file are written (link.py);
3. arm: `systemd-run --on-active=<link_rollback_s>s` runs revert.sh unless the apply was confirmed by then;
4. apply: `netplan generate && netplan apply`, detached (setsid), its exit status written to a file, so a cut
   management path cannot leave the deploy waiting on a dead channel;
5. confirm (on this machine): a fresh ssh connection (a new connector, new TCP session and authentication) waits
   for the apply's status, checks the management address, and claims the decision. If no connection succeeds in
   time, the Spark reverts by itself and this host fails with what happened and what to check.

revert.sh and the confirmation both `mkdir <dir>/decided` first: whichever comes second does nothing, so a late
confirmation never keeps a configuration the revert already undid.
"""

from __future__ import annotations

import posixpath
import secrets
import time
from shlex import quote

from pyinfra.api import FunctionCommand, StringCommand

from operations.layout import NETPLAN_APPLY_DIR, NETPLAN_REVERT_UNIT
from operations.settings.shapes import CONFIRM_WAIT_APPLY_S

MARK = "sparkfold-confirm="  # the confirmation's verdict on stderr
KEEP_DAYS = 30  # apply directories older than this are pruned when a new one is made


class NetplanNotConfirmed(Exception):
    """The apply was not confirmed over a new ssh connection; the message says what the Spark does about it."""


def new_apply_dir() -> str:
    return f"{NETPLAN_APPLY_DIR}/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def revert_script(apply_dir: str, before: dict[str, bool], seconds: int) -> str:
    """revert.sh: put back each path in `before` (True: it existed, restore its copy; False: remove ours), then
    re-apply. Paths are copied to before/<n> in the order of sorted(before)."""
    lines = ["#!/bin/sh",
             f"# sparkfold: undo the netplan apply of {apply_dir} unless it was confirmed within {seconds} s",
             f"d={quote(apply_dir)}",
             'mkdir "$d/decided" 2>/dev/null || exit 0  # confirmed, or already reverted',
             "{",
             '  echo "reverting at $(date -Is)"']
    for n, path in enumerate(sorted(before)):
        if before[path]:
            lines.append(f'  cp -p "$d/before/{n}" {quote(path)}')
        else:
            lines.append(f"  rm -f {quote(path)}")
    lines += ["  netplan generate && netplan apply",
              '  echo "netplan apply after the revert: exit $?"',
              '} >>"$d/revert.log" 2>&1',
              'date -Is >"$d/reverted"', ""]
    return "\n".join(lines)


def snapshot_command(apply_dir: str, before: dict[str, bool], seconds: int) -> StringCommand:
    """Copy the files this apply touches and write revert.sh (root only: netplan files can hold secrets)."""
    parts = [f"umask 077 && mkdir -p {quote(apply_dir + '/before')}"]
    parts += [f"cp -p {quote(path)} {quote(f'{apply_dir}/before/{n}')}" for n, path in enumerate(sorted(before))
              if before[path]]
    parts.append(f"printf '%s' {quote(revert_script(apply_dir, before, seconds))} > {quote(apply_dir + '/revert.sh')}")
    # old apply directories are ours alone; a month of history is plenty to read what happened
    parts.append(f"find {quote(posixpath.dirname(apply_dir))} -mindepth 1 -maxdepth 1 -type d -mtime +{KEEP_DAYS} "
                 "-exec rm -rf {} +")
    return StringCommand(" && ".join(parts))


def arm_command(apply_dir: str, seconds: int) -> StringCommand:
    """The revert, armed on the Spark: it fires even if this machine, the network or the ssh session is gone."""
    unit = f"{NETPLAN_REVERT_UNIT}-{apply_dir.rsplit('/', 1)[-1]}"
    return StringCommand(f"systemd-run --quiet --unit={quote(unit)} --on-active={int(seconds)}s "
                         f"/bin/sh {quote(apply_dir + '/revert.sh')}")


def apply_command(apply_dir: str) -> StringCommand:
    """netplan generate && apply, detached from this ssh session; the exit status lands in <dir>/applied."""
    folder = quote(apply_dir)
    inner = (f"netplan generate && netplan apply; echo $? > {folder}/applied.tmp && "
             f"mv {folder}/applied.tmp {folder}/applied")
    return StringCommand(f"setsid sh -c {quote(inner)} > {folder}/apply.log 2>&1 < /dev/null &")


def confirm_script(apply_dir: str, mgmt_dev: str | None, mgmt_ip: str | None) -> str:
    """Run over the new connection: wait for the apply, revert now if it failed or lost the management address,
    else claim the decision (exit 0). On failure the last stderr line is MARK<n>: 2 apply failed, 3 management
    address lost, 4 apply hung, 5 the automatic revert already ran (no exit code reaches pyinfra's caller)."""
    folder = quote(apply_dir)
    tries = CONFIRM_WAIT_APPLY_S * 2
    script = (f"i=0; while [ ! -e {folder}/applied ]; do i=$((i+1)); "
              f"if [ $i -gt {tries} ]; then echo 'netplan apply did not finish within {CONFIRM_WAIT_APPLY_S} s' "
              f">&2; sh {folder}/revert.sh; echo {MARK}4 >&2; exit 1; fi; sleep 0.5; done; "
              f"rc=$(cat {folder}/applied); if [ \"$rc\" != 0 ]; then cat {folder}/apply.log >&2; "
              f"sh {folder}/revert.sh; "
              f"echo {MARK}2 >&2; exit 1; fi; ")
    if mgmt_dev and mgmt_ip:
        script += (f"ip -4 -o addr show dev {quote(mgmt_dev)} | grep -qF {quote(f' inet {mgmt_ip}/')} || "
                   f"{{ sh {folder}/revert.sh; echo {MARK}3 >&2; exit 1; }}; ")
    script += (f"mkdir {folder}/decided 2>/dev/null || "
               f"{{ cat {folder}/reverted >&2; echo {MARK}5 >&2; exit 1; }}; "
               f"date -Is > {folder}/confirmed")
    return script


def _why(code: int, apply_dir: str, mgmt: str, stderr: str) -> str:
    said = f" ({stderr.strip()})" if stderr.strip() else ""
    return {
        2: f"netplan apply failed{said}; the previous netplan files are back and applied",
        3: f"after netplan apply the management interface lost {mgmt}; the previous netplan files are back and "
           "applied: check that link_rails names only the CX7 netdevs",
        4: f"netplan apply did not finish within {CONFIRM_WAIT_APPLY_S} s; the previous netplan files are back",
        5: f"the Spark's automatic revert ran before the confirmation{said}: its network is as it was before",
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


def confirm_over_new_connection(state, host, apply_dir: str, mgmt_dev: str | None, mgmt_ip: str | None,
                                seconds: int, sudo: dict | None = None) -> None:
    """On this machine, after the detached apply: open a new connection to the host (the one pyinfra holds was
    opened before the apply and proves nothing) and confirm through it. Raises NetplanNotConfirmed."""
    margin = min(15, max(5, seconds // 3))  # the confirmation itself must finish before the revert fires
    deadline = time.monotonic() + seconds - margin
    last_error = "no attempt"
    while True:
        connector = host.connector_cls(state, host)
        try:
            connector.connect()
        except Exception as exc:  # ConnectError and whatever the transport raises: all mean "not reachable yet"
            last_error = str(exc) or exc.__class__.__name__
            if time.monotonic() >= deadline:
                raise NetplanNotConfirmed(
                    f"{host.name}: no new ssh connection succeeded within {seconds - margin} s after netplan apply "
                    f"(last error: {last_error}). The Spark puts its previous netplan files back by itself "
                    f"{seconds} s after the apply ({apply_dir}/revert.sh, log in {apply_dir}/revert.log). Check "
                    "from a console that the management network is up, that link_rails names only the CX7 "
                    "netdevs and that their subnets are the link's own, then re-run.") from None
            time.sleep(2)
            continue
        try:
            ok, output = connector.run_shell_command(StringCommand(confirm_script(apply_dir, mgmt_dev, mgmt_ip)),
                                                     _sudo=True, **(sudo or {}))
        finally:
            client = getattr(connector, "client", None)
            if client is not None:
                client.close()
        if ok:
            return
        said = [line for line in output.stderr_lines if not line.startswith(MARK)]
        codes = [line[len(MARK):] for line in output.stderr_lines if line.startswith(MARK)]
        code = int(codes[-1]) if codes and codes[-1].isdigit() else 1
        raise NetplanNotConfirmed(f"{host.name}: {_why(code, apply_dir, str(mgmt_ip), ' '.join(said))}")


def guarded_apply(apply_dir: str, before: dict[str, bool], seconds: int, mgmt_dev: str | None,
                  mgmt_ip: str | None, sudo: dict | None = None):
    """The commands around the file changes: ([snapshot, arm], [apply, confirm]). The revert is armed before the
    files are written, so a run killed at any point after the snapshot leaves a Spark that puts its files back by
    itself (a new config would otherwise wait, unguarded, for the next reboot or apply)."""
    head = [snapshot_command(apply_dir, before, seconds), arm_command(apply_dir, seconds)]
    tail = [apply_command(apply_dir),
            FunctionCommand(confirm_over_new_connection, (apply_dir, mgmt_dev, mgmt_ip, int(seconds)),
                            {"sudo": SudoArguments(sudo or {})})]
    return head, tail
