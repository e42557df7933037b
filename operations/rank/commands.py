"""The shell commands that stop and start a rank, shared by the pair step, stop.py and preflight, and the one that
writes a generation record.

Each builder is pure: it returns pyinfra commands for the operation that yields them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from io import StringIO

from pyinfra.api import FileUploadCommand, StringCommand

from operations.layout import GPU_CLOCK_RECORD, GPU_CLOCK_SCRIPT, script_path
from operations.rank.generation import LAST_GOOD, Generation
from operations.rank.spec import ContainerSpec, env_file_text
from operations.remote.progress_command import LiveCommand
from operations.util import sh

MEMORY_POLL_S = 1  # between two reads of MemAvailable while a rank's memory comes back (one awk: cheap)


def save_log_command(name: str, rank: int, log_dir: str, log_keep: int) -> StringCommand:
    """Save the container's log (docker rm deletes it), keeping the newest `log_keep` per rank."""
    d = shlex.quote(log_dir)
    script = (
        f"mkdir -p {d} && ts=$(date +%Y%m%d-%H%M%S) && f={d}/\"$ts\"-rank{rank}.log.gz && i=1 && "
        f"while [ -e \"$f\" ]; do f={d}/\"$ts\"-rank{rank}.$i.log.gz; i=$((i+1)); done && "
        f"docker logs --timestamps {shlex.quote(name)} 2>&1 | gzip > \"$f\" && "
        f"echo \"sparkfold: saved rank {rank}'s log in $f\" && "
        f"ls -1t {d}/*-rank{rank}.log.gz {d}/*-rank{rank}.*.log.gz 2>/dev/null | tail -n +{int(log_keep) + 1} | "
        "while read -r old; do rm -f -- \"$old\"; done"
    )
    return StringCommand("sh", "-c", shlex.quote(script))


def removal_commands(name: str, rank: int, running: bool, stop_timeout: int, log_dir: str,
                     log_keep: int) -> Iterator[StringCommand]:
    """Stop (politely first), save the log, remove."""
    if running:
        yield StringCommand(sh("docker", "stop", "-t", stop_timeout, name), ">/dev/null")
    yield save_log_command(name, rank, log_dir, log_keep)
    yield StringCommand(sh("docker", "rm", "-f", name), ">/dev/null")


def memory_wait_command(rank: int, min_avail_gib: float, tries: int = 60, failure: str = "", *,
                        every: int) -> StringCommand:
    """Fail unless MemAvailable reaches min_avail_gib within about a minute (memory comes back after a stop).
    failure: the message on timeout (default: rank `rank` needs ...). every: seconds between its waiting lines."""
    need_kib = int(min_avail_gib * 1024 * 1024)
    said = (f"echo {shlex.quote(failure)} >&2" if failure else
            f"echo \"sparkfold: rank {rank} needs min_avail_gib = {min_avail_gib:g} GiB of MemAvailable on this "
            "Spark but only $((${a:-0}/1048576)) GiB is available: stop what else uses memory here, or lower "
            "min_avail_gib\" >&2")
    # a line every `every` s while it waits (LiveCommand: shown as it comes, at pyinfra's default verbosity)
    per_line = max(int(every) // MEMORY_POLL_S, 1)
    script = (
        f"i=0; while :; do a=$(awk '/^MemAvailable:/ {{print $2}}' /proc/meminfo); [ \"${{a:-0}}\" -ge {need_kib} ] "
        f"&& break; i=$((i+1)); if [ $i -ge {tries} ]; then {said}; exit 1; fi; "
        f"[ $((i % {per_line})) = 0 ] && echo \"rank {rank}: waiting for memory: $((${{a:-0}}/1048576)) of "
        f"{min_avail_gib:g} GiB available ($((i*{MEMORY_POLL_S})) s)\"; sleep {MEMORY_POLL_S}; done"
    )
    return LiveCommand("sh", "-c", shlex.quote(script))


def lock_command(mhz: int, nvidia_smi: str, record_path: str = GPU_CLOCK_RECORD, **arguments) -> StringCommand:
    """Apply the GPU clock lock now and record it (the script the timer runs): fails unless every GPU got exactly
    `mhz`. The GPU clock step runs it, and the pair step right before a rank starts."""
    return StringCommand("sh", sh(script_path(GPU_CLOCK_SCRIPT)), sh(nvidia_smi), str(int(mhz)), sh(record_path),
                         **arguments)


def start_commands(spec: ContainerSpec, min_avail_gib: float, gpu_clock_mhz: int, nvidia_smi: str,
                   env_dir: str, *, every: int) -> Iterator[StringCommand | FileUploadCommand]:
    """Mounts checked, memory waited for, the GPU clock lock applied again (a reset since the last timer run would
    let this rank run unlocked for up to a period), then `docker run`. The environment (engine_env may hold
    secrets) goes through a file uploaded into env_dir (0700, the ssh user's: the docker client reads it), never
    through an argv `ps` shows, and the file is removed once `docker run` has read it."""
    binds = [(src, ro) for src, _dst, ro in spec.mounts if src.startswith("/")]
    writable = [src for src, ro in binds if not ro]
    if writable:
        yield StringCommand(sh("mkdir", "-p", *writable))
    for src, ro in binds:
        if ro:
            msg = f"sparkfold: rank {spec.rank} mounts {src}, which is missing: run deploy.py to prepare it"
            yield StringCommand("test", "-e", shlex.quote(src), "||", "{", "echo", shlex.quote(msg), ">&2;",
                                "exit", "1;", "}")
    yield memory_wait_command(spec.rank, min_avail_gib, every=every)
    yield lock_command(gpu_clock_mhz, nvidia_smi, _sudo=True)
    env_file = f"{env_dir}/{spec.name}.env"
    yield StringCommand(sh("mkdir", "-p", "-m", "700", env_dir), "&&", sh("chmod", "700", env_dir), "&&",
                        sh("install", "-m", "600", "/dev/null", env_file))
    yield FileUploadCommand(StringIO(env_file_text(spec)), env_file)
    # removed whether docker run succeeds or not; its exit status is the command's
    yield StringCommand(sh(*spec.run_argv(env_file)), "; rc=$?;", sh("rm", "-f", "--", env_file), "; exit $rc")


def root_only(d: str) -> str:
    """Shell: the records' folder made root's and 0700, and what follows written 0600 (umask)."""
    return f"mkdir -p {d} && chown root:root {d} && chmod 700 {d} && umask 077"


def record_command(folder: str, generation: Generation) -> StringCommand:
    """The record written aside then renamed, then last-good: root's, the folder 0700 and every file 0600 (a record
    is started as it is, and its environment may hold secrets). Its `seq` is counted here, on the Spark, from the
    folder's `seq` file: the order of the records never depends on which controller's clock wrote them."""
    d, name = shlex.quote(folder), generation.id
    # the record's JSON without its closing brace: the Spark adds its seq
    body = shlex.quote(json.dumps(generation.record(), sort_keys=True)[:-1])
    return StringCommand("sh", "-c", shlex.quote(
        f"{root_only(d)} && "
        f"n=$(( $(cat {d}/seq 2>/dev/null || echo 0) + 1 )) && printf '%s\\n' \"$n\" > {d}/.seq.tmp && "
        f"mv -f {d}/.seq.tmp {d}/seq && "
        f"printf '%s, \"seq\": %s}}\\n' {body} \"$n\" > {d}/.{name}.json.tmp && "
        f"mv -f {d}/.{name}.json.tmp {d}/{name}.json && printf '%s\\n' {name} > {d}/.last-good.tmp && "
        f"mv -f {d}/.last-good.tmp {d}/{LAST_GOOD}"), _sudo=True)
