"""The shell that starts a stream on a Spark and the runner that carries it, pure text (no host, no I/O).

A stream's folder, <root>/<name> (root: Layout.streams, the ssh user's, 0700), holds:

    script   the work, run with `sh -e`          lane, label, after   how it is shown, what it waits for
    inputs   digest of the work (RUN_TOKEN masked)   run     the run it belongs to (peer_ssh.RUN_TOKEN)
    watch    "<pid> <start time>" of that run's session process (operations/util/session.py)
    pid, boot, pstart   the runner, a session leader (its process group holds the runner and its watchdog)
    work     the work's process group (the script runs in a session of its own)
    queued, began, ended   epoch seconds (began: its waits are over)   rc   its exit status (143: stopped)
    stopping   when it was told to stop (it waits for its work to end, then writes rc)
    log      everything it printed (the progress runner's lines)

The runner waits for each stream named in `after` that belongs to the same run (one of another run is not this
run's work), then runs the script. A watchdog ends the stream when the run's session process is gone (the run was
killed or lost its connection), so no work outlives its run unseen; what is whole stays, and each command resumes
(docker's build cache, the hub client's partial files, rsync's --partial), so the next run starts it again.

A stopped runner passes the TERM on to the work's process group and waits (up to WORK_STOP_S, then KILL) until
nothing of it runs before it records rc 143 and exits: a restart then never starts new work beside old work still
stopping (a tool's container shutting down, a download's last write).
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex

from operations.layout import BOOT_ID
from operations.util.peer_ssh import RUN_TOKEN
from operations.util.session import FIND_SESSION, STAT_FUNCTIONS

STATE_FILES = ("run", "inputs", "lane", "label", "after", "queued", "began", "ended", "rc")  # what the fact reads
STOPPED_RC = 143  # the runner's status when it was stopped (SIGTERM: its run is gone, or a new run restarts it)
WORK_STOP_S = 30  # how long a stopped runner waits for its work to end before it kills what is left
_SCRIPT_EOF = "SPARKFOLD_STREAM_EOF"

# alive DIR: the stream in DIR has a runner that still runs (same boot, same start time: not a reused pid)
ALIVE = ('alive() { [ -f "$1/pid" ] && [ "$(cat "$1/boot" 2>/dev/null)" = "$(cat ' + BOOT_ID + ')" ] && '
         '[ -n "$(cat "$1/pstart" 2>/dev/null)" ] && '
         '[ "$(start_of "$(cat "$1/pid")")" = "$(cat "$1/pstart")" ]; }; ')

# $1: the stream's folder. Written so that `sh -c RUNNER sh DIR` runs it.
RUNNER = (STAT_FUNCTIONS + ALIVE + r'''
d=$1; root=${d%/*}
now() { date +%s.%N; }
put() { printf '%s\n' "$2" > "$d/$1.tmp" && mv -f "$d/$1.tmp" "$d/$1"; }
finish() { trap '' TERM HUP INT; put ended "$(now)"; put rc "$1"; exit "$1"; }
work=
stop_work() {
  # a TERM between the work's start and `work=$!`: $! is already the work's (before `began`, there is none)
  [ -n "$work" ] || { [ -f "$d/began" ] && work=$!; } || return 0
  kill -TERM -"$work" 2>/dev/null; i=0
  while kill -0 -"$work" 2>/dev/null && [ $i -lt ''' + str(WORK_STOP_S * 10) + r''' ]; do sleep 0.1; i=$((i + 1)); done
  ! kill -0 -"$work" 2>/dev/null || { echo "sparkfold: $(cat "$d/label"): killed"; kill -KILL -"$work"; }
}
put boot "$(cat ''' + BOOT_ID + r''')"; put pstart "$(start_of $$)"; put pid $$
# once stopping, it is not adopted (launch_command) and a second TERM does not start the wait over
stopped() {
  trap '' TERM HUP INT; put stopping "$(now)"; echo "sparkfold: $(cat "$d/label"): stopped"
  stop_work; finish ''' + str(STOPPED_RC) + r'''
}
trap stopped TERM HUP INT
( while [ ! -f "$d/rc" ]; do
    read -r wp ws < "$d/watch" || ws=
    if [ -z "$ws" ] || [ "$(start_of "$wp")" != "$ws" ]; then
      echo "sparkfold: $(cat "$d/label"): the run that started it is gone"; kill -TERM -$$; exit 0
    fi
    sleep 2
  done ) &
for a in $(cat "$d/after"); do
  said=
  while [ "$(cat "$root/$a/run" 2>/dev/null)" = "$(cat "$d/run")" ] && [ ! -f "$root/$a/rc" ] && alive "$root/$a"
  do
    [ -n "$said" ] || { said=1; echo "$(cat "$d/label"): waits for $(cat "$root/$a/label")"; }
    sleep 1
  done
  if [ "$(cat "$root/$a/run" 2>/dev/null)" = "$(cat "$d/run")" ] && [ "$(cat "$root/$a/rc" 2>/dev/null)" != 0 ]
  then
    echo "sparkfold: $(cat "$d/label"): not started: $(cat "$root/$a/label" 2>/dev/null || echo "$a") did not finish"
    finish 1
  fi
done
put began "$(now)"
# a session of its own (setsid: the child is no group leader, so setsid does not fork and $! is its group)
setsid sh -e "$d/script" & work=$!; put work "$work"
wait "$work"
finish $?
''')


def stream_dir(root: str, name: str) -> str:
    return posixpath.join(root, name)


def inputs_digest(commands: list[str], after: tuple[str, ...]) -> str:
    """What a stream does, as one digest: the same work started by another run has the same inputs (the run's own
    token, part of the head's ssh options, is left out)."""
    text = "\n".join(["after " + " ".join(after), *commands]).replace(RUN_TOKEN, "<run>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def step(command: str) -> str:
    """`command` as one step of a stream's script: run as pyinfra runs a command (a shell of its own, no -e inside,
    so its own checks speak; its status is its last command's), and the script ends with that status when it fails.
    `sh -e` alone passes over a failure inside a list (`cd x && mv a b`) on any line but the last. The command may
    end with a heredoc."""
    return f"( set +e\n{command}\n) || exit $?"


def script_text(commands: list[str]) -> str:
    """The stream's work as a script: each command a `step` (a whole command: an `if` opened in one is closed in
    it), the first failure ends it."""
    text = "\n".join(step(c) for c in commands) + "\n"
    if _SCRIPT_EOF in text:
        raise ValueError(f"a stream's command holds {_SCRIPT_EOF}")
    return text


def launch_command(root: str, name: str, lane: str, label: str, after: tuple[str, ...], commands: list[str],
                   run: str = RUN_TOKEN) -> str:
    """The command that starts the stream `name` in the background and returns once its runner runs.

    The same work already running (an earlier run's stream its watchdog has not ended yet) is adopted: it now
    belongs to this run and watches this run's session. Other work of that name still running, or work that is
    stopping already, is stopped first and waited for (what it made is kept: the new one resumes it)."""
    d = stream_dir(root, name)
    q = shlex.quote
    inputs = inputs_digest(commands, after)
    fields = {"lane": lane, "label": label, "after": "\n".join(after), "inputs": inputs}
    unfollowed = (f"sparkfold: {label}: running already, but {d} cannot be written: this run cannot follow it "
                  "(disk full?)")
    write_fields = " && ".join(f"printf '%s\\n' {q(v)} > \"$d\"/{k}" for k, v in fields.items())
    return (
        STAT_FUNCTIONS + ALIVE + FIND_SESSION + "; "
        f"root={q(root)}; d={q(d)}; mkdir -p \"$root\" && chmod 0700 \"$root\" || exit 1; "
        f"if alive \"$d\" && [ ! -e \"$d/stopping\" ] && [ \"$(cat \"$d/inputs\" 2>/dev/null)\" = {q(inputs)} ]; then "
        f"printf '%s\\n' \"$p $(start_of $p)\" > \"$d/watch.tmp\" && mv -f \"$d/watch.tmp\" \"$d/watch\" && "
        f"printf '%s\\n' {q(run)} > \"$d/run.tmp\" && mv -f \"$d/run.tmp\" \"$d/run\" && "
        f"echo {q(f'sparkfold: {label}: running already, followed by this run')} && exit 0; "
        f"echo {q(unfollowed)} >&2; exit 1; fi; "
        "if alive \"$d\"; then kill -TERM -\"$(cat \"$d/pid\")\"; i=0; "
        f"while alive \"$d\" && [ $i -lt {(WORK_STOP_S + 5) * 10} ]; do sleep 0.1; i=$((i + 1)); done; "
        "w=$(cat \"$d/work\" 2>/dev/null); ! alive \"$d\" || kill -KILL -\"$(cat \"$d/pid\")\" "
        "${w:+-\"$w\"}; fi; "
        "rm -rf \"$d\" && mkdir -m 0700 \"$d\" && "
        f"{write_fields} && printf '%s\\n' {q(run)} > \"$d/run\" && "
        "printf '%s\\n' \"$p $(start_of $p)\" > \"$d/watch\" && date +%s.%N > \"$d/queued\" && "
        f"cat > \"$d/script\" <<'{_SCRIPT_EOF}' || exit 1\n{script_text(commands)}{_SCRIPT_EOF}\n"
        f"setsid sh -c {q(RUNNER)} sh \"$d\" < /dev/null >> \"$d/log\" 2>&1 &\n"
        "i=0; while [ ! -f \"$d/pid\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done; "
        f"[ -f \"$d/pid\" ] || {{ echo {q(f'sparkfold: {label}: the background runner did not start')} >&2; "
        "tail -n 20 \"$d/log\" >&2; exit 1; }; "
        f"echo {q(f'sparkfold: {label}: started in the background')}"
    )
