"""The shell that starts a stream on a Spark as a systemd unit, and the script the unit runs, pure text (no host,
no I/O).

A stream runs as the transient service `sparkfold-<name>` (operations/remote/stream_unit.py), the system's and not
the ssh session's: a cut connection or a killed run leaves it going, and the next run adopts it. systemd keeps its
state (`systemctl show`), its log (the journal, by invocation id) and stops it (`systemctl stop`: TERM to its whole
control group, KILL after STOP_TIMEOUT_S). Its folder, <root>/<name> (root: Layout.streams, the ssh user's, 0700),
holds what systemd does not:

    script   the work, run with `sh -e`          lane, label, after   how it is shown, what it waits for
    inputs   digest of the work (RUN_TOKEN masked; also the unit's SPARKFOLD_INPUTS)
    run      the run that started or adopted it (peer_ssh.RUN_TOKEN)
    queued, began, ended   epoch seconds (began: its waits are over; ended: its work exited, not when stopped)

The unit's script waits for each stream named in `after` while that one's unit runs, whichever run follows it (a
run adopting streams names itself in them one at a time), then runs the work. It does not start when a stream it
waited for, or one of its own run, did not finish; one an earlier run left failed is not this run's work.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex

from operations.remote.stream_unit import INPUTS_VARIABLE, unit_name
from operations.util.peer_ssh import RUN_TOKEN, mux_socket_prefix

STATE_FILES = ("run", "inputs", "lane", "label", "after", "queued", "began", "ended")  # what the fact reads
STOP_TIMEOUT_S = 30  # a stopped stream's control group gets this long after the TERM before systemd kills it
_SCRIPT_EOF = "SPARKFOLD_STREAM_EOF"

WAIT_POLL_S = 1  # how often a stream waiting for its upstream asks systemd whether that one still runs


def runner_script(poll_s: float = WAIT_POLL_S) -> str:
    """The unit's script. $1: the stream's folder. Written to <folder>/runner, which the unit runs
    (`sh <folder>/runner <folder>`): never given inline, as systemd expands `$NAME` in a unit's command line
    (systemd-run has no way to turn that off before systemd 254). poll_s: the upstream's poll (the tests' is short)."""
    return r'''
d=$1; root=${d%/*}
put() { printf '%s\n' "$2" > "$d/$1.tmp" && mv -f "$d/$1.tmp" "$d/$1"; }
field() { systemctl show "''' + unit_name("") + r'''$1" -p "$2" --value; }
first=$(cat "$d/run")
ours() { r=$(cat "$root/$1/run" 2>/dev/null); [ "$r" = "$first" ] || [ "$r" = "$(cat "$d/run")" ]; }
running() { case "$(field "$1" ActiveState)/$(field "$1" SubState)" in
  activating/*|reloading/*|deactivating/*) true;; active/exited) false;; active/*) true;; *) false;; esac; }
succeeded() { [ "$(field "$1" ActiveState)/$(field "$1" Result)/$(field "$1" ExecMainStatus)" = active/success/0 ]; }
for a in $(cat "$d/after"); do
  said=
  while running "$a"; do
    [ -n "$said" ] || { said=1; echo "$(cat "$d/label"): waits for $(cat "$root/$a/label")"; }
    sleep ''' + f"{poll_s:g}" + r'''
  done
  if { [ -n "$said" ] || ours "$a"; } && ! succeeded "$a"; then
    echo "sparkfold: $(cat "$d/label"): not started: $(cat "$root/$a/label" 2>/dev/null || echo "$a") did not finish"
    exit 1
  fi
done
put began "$(date +%s.%N)"
sh -e "$d/script"; rc=$?
put ended "$(date +%s.%N)"
exit $rc
'''


RUNNER = runner_script()


def stream_dir(root: str, name: str) -> str:
    return posixpath.join(root, name)


_EVERY = re.compile(r"--every [0-9.]+")  # operations/remote/progress_command's interval


def inputs_digest(commands: list[str], after: tuple[str, ...]) -> str:
    """What a stream does, as one digest: the same work started by another run has the same inputs (left out: the
    run's own token, part of the head's ssh options, and how often it prints progress, progress_every_s, so a run
    with another interval adopts the work still going instead of starting it again)."""
    text = "\n".join(["after " + " ".join(after), *commands]).replace(RUN_TOKEN, "<run>")
    text = _EVERY.sub("--every <s>", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step(command: str) -> str:
    """`command` as one step of a stream's script: run as pyinfra runs a command (a shell of its own, no -e inside,
    so its own checks speak; its status is its last command's), and the script ends with that status when it fails.
    `sh -e` alone passes over a failure inside a list (`cd x && mv a b`) on any line but the last. The command may
    end with a heredoc."""
    return f"( set +e\n{command}\n) || exit $?"


def script_text(commands: list[str], name: str = "") -> str:
    """The stream's work as a script: each command a `step` (a whole command: an `if` opened in one is closed in
    it), the first failure ends it. name: the stream's, which its ssh connections to the worker share (own_mux)."""
    text = own_mux("\n".join(step(c) for c in commands) + "\n", name)
    if _SCRIPT_EOF in text:
        raise ValueError(f"a stream's command holds {_SCRIPT_EOF}")
    return text


def own_mux(text: str, name: str) -> str:
    """`text` with the run's shared ssh connection to the worker (peer_ssh) made this stream's own. journald files
    a line under the unit of the process that writes it, and a shared connection's master writes what its clients'
    remote commands print: a master started elsewhere (the run's foreground, another stream) would take the lines
    out of this unit's journal. One per stream keeps them in it."""
    if not name:
        return text
    tag = "s" + hashlib.sha256(name.encode()).hexdigest()[:7]
    return text.replace(mux_socket_prefix(), mux_socket_prefix(tag))


def systemd_run_words(name: str, label: str, folder: str, inputs: str) -> list[str]:
    """The unit's start, as the ssh user runs it ($USER, $HOME and $PATH expand in the ssh user's shell): the work
    runs as that user and its groups (docker), in its home, with its PATH; the unit stays after its work ends
    (RemainAfterExit: its Result and ExecMainStatus readable until the next start frees the name; no --collect,
    which would unload it at once); a stop ends its whole control group."""
    return ["sudo", "-n", "systemd-run", "--quiet", f"--unit={unit_name(name)}",
            f"--description={shlex.quote('sparkfold: ' + label)}", '--uid="$(id -un)"', '--gid="$(id -gn)"',
            "-p", "RemainAfterExit=yes", "-p", "KillMode=control-group", "-p", f"TimeoutStopSec={STOP_TIMEOUT_S}",
            '--working-directory="$HOME"', '-E', 'PATH="$PATH"', "-E", f"{INPUTS_VARIABLE}={inputs}",
            "/bin/sh", shlex.quote(unit_word(posixpath.join(folder, "runner"))), shlex.quote(unit_word(folder))]


def unit_word(word: str) -> str:
    """A word of a unit's command line as systemd passes it on: `$` doubled (systemd would expand `$NAME`)."""
    return word.replace("$", "$$")


def freeing_command(name: str, free: str | None) -> str:
    """`systemctl stop` (a finished unit keeps its name; a running one ends, its control group with it) or
    `systemctl reset-failed` (a failed one), so the name can start again; "" when it is free."""
    if free not in (None, "stop", "reset-failed"):
        raise ValueError(f"a stream's unit is freed by stop or reset-failed, not {free}")
    return f"sudo -n systemctl {free} {shlex.quote(unit_name(name))} && " if free else ""


def launch_command(root: str, name: str, lane: str, label: str, after: tuple[str, ...], commands: list[str],
                   free: str | None = None, run: str = RUN_TOKEN) -> str:
    """The command that starts the stream `name` as its unit (after freeing its name: freeing_command) and returns
    once the unit runs. Its folder is written afresh; what the work made before is kept (the new one resumes it)."""
    d = stream_dir(root, name)
    q = shlex.quote
    inputs = inputs_digest(commands, after)
    fields = {"lane": lane, "label": label, "after": "\n".join(after), "inputs": inputs, "run": run}
    write_fields = " && ".join(f"printf '%s\\n' {q(v)} > \"$d\"/{k}" for k, v in fields.items())
    return (
        f"root={q(root)}; d={q(d)}; mkdir -p \"$root\" && chmod 0700 \"$root\" && "
        f"{freeing_command(name, free)}"
        "rm -rf \"$d\" && mkdir -m 0700 \"$d\" && "
        f"{write_fields} && date +%s.%N > \"$d/queued\" && "
        f"cat > \"$d/script\" <<'{_SCRIPT_EOF}' || exit 1\n{script_text(commands, name)}{_SCRIPT_EOF}\n"
        f"cat > \"$d/runner\" <<'{_SCRIPT_EOF}' || exit 1\n{RUNNER.lstrip()}{_SCRIPT_EOF}\n"
        f"{' '.join(systemd_run_words(name, label, d, inputs))} || exit 1\n"
        f"echo {q(f'sparkfold: {label}: started in the background ({unit_name(name)})')}"
    )


def adopt_command(root: str, name: str, label: str, run: str = RUN_TOKEN) -> str:
    """The same work running from an earlier run, followed by this one: its folder names this run (the waiter and
    the streams that read it go by that)."""
    d = stream_dir(root, name)
    q = shlex.quote
    return (f"printf '%s\\n' {q(run)} > {q(d + '/run.tmp')} && mv -f {q(d + '/run.tmp')} {q(d + '/run')} && "
            f"echo {q(f'sparkfold: {label}: running already ({unit_name(name)}), followed by this run')}")


def stop_command(name: str) -> str:
    """A stream's unit stopped (stop.py): TERM to its control group, KILL after STOP_TIMEOUT_S; what is whole
    stays."""
    return f"sudo -n systemctl stop {shlex.quote(unit_name(name))}"
