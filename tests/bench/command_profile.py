"""Where a deploy's time goes: every command pyinfra sends over ssh, counted and timed by operation and by sudo.

    flock /tmp/sparksim.lock .venv/bin/python -m tests.bench.command_profile [pyinfra arguments, e.g. deploy.py -y]

Runs the pyinfra CLI in this process with the ssh connector's run_shell_command wrapped, against the simulated pair
(SPARKFOLD_SITE defaults to the sim's site file), and prints after pyinfra ends: commands and seconds per operation
(both Sparks together; they run at once, so the sums exceed the wall time), and the split between commands run
through sudo and as the ssh user. A tool for finding what to make faster, not a measure: the ratios are
tests/bench/deploy_speed.py's.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import time

from pyinfra.connectors.ssh import SSHConnector

from tests.sim import sim

COUNT: collections.Counter[str] = collections.Counter()
SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)
SUDO: collections.Counter[str] = collections.Counter()
SUDO_SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)


def _operation_name(connector: SSHConnector) -> str:
    host = connector.host
    if not host.current_op_hash:
        return "(outside any operation)"
    return ", ".join(sorted(host.state.get_op_meta(host.current_op_hash).names))


def _wrap(original):
    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        start = time.monotonic()
        try:
            return original(self, command, print_output=print_output, print_input=print_input, **arguments)
        finally:
            elapsed = time.monotonic() - start
            name, kind = _operation_name(self), "sudo" if arguments.get("_sudo") else "user"
            COUNT[name] += 1
            SECONDS[name] += elapsed
            SUDO[kind] += 1
            SUDO_SECONDS[kind] += elapsed

    return run_shell_command


def report() -> None:
    out = sys.stderr
    print(f"\n{'commands':>8} {'seconds':>8}  operation", file=out)
    for name, seconds in sorted(SECONDS.items(), key=lambda item: -item[1]):
        print(f"{COUNT[name]:8d} {seconds:8.2f}  {name}", file=out)
    for kind in ("sudo", "user"):
        n = SUDO[kind]
        print(f"{kind}: {n} commands, {SUDO_SECONDS[kind]:.2f} s, {1000 * SUDO_SECONDS[kind] / max(n, 1):.0f} ms each",
              file=out)


def main() -> None:
    os.environ.setdefault("SPARKFOLD_SITE", str(sim.site_path()))
    os.environ.setdefault("PYINFRA_PROGRESS", "off")
    SSHConnector.run_shell_command = _wrap(SSHConnector.run_shell_command)  # type: ignore[method-assign]
    atexit.register(report)
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", "inventory.py", *(sys.argv[1:] or ["deploy.py", "-y"])]
    pyinfra_main()


if __name__ == "__main__":
    main()
