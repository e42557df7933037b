"""The copy to the worker on the simulated pair: a worker copy damaged in a way sizes and mtimes cannot show is
found by the worker's check, removed, and copied again by the next run; and a copy leaves nothing of itself (its
temporary folder, the secret, a listener, the progress log) on either Spark.

The damage flips bytes in the middle of one of the worker's Engram tables and puts its mtime back, so its size and
mtime match the head's, as a stream damaged on the cable would. The worker's check marker goes too: the damage
arrived with a copy, before its first check (a file damaged after its check passed is not hashed again, by
design: the markers compare sizes and mtimes instead of re-reading hundreds of GB on every run).

Runs after test_deploy.py (file order) and leaves a converged, serving pair.
"""

from __future__ import annotations

from test_deploy import NAME, changed_ops, chat, deploy, failing_deploy

ENGRAM = "/home/nvidia/.cache/sparkfold/engram"
DAMAGED = f"{ENGRAM}/model-00047-of-00048.safetensors"  # one of engram_files' defaults
MARKER = f"{ENGRAM}/.sparkfold-verified"
# flip 8 bytes in the middle (each byte's complement: surely different), then put atime and mtime back to the ns
FLIP = ("import os, sys; p = sys.argv[1]; st = os.stat(p); assert st.st_size >= 16, st.st_size\n"
        "with open(p, 'r+b') as f:\n"
        "    f.seek(st.st_size // 2); old = f.read(8); f.seek(st.st_size // 2); f.write(bytes(b ^ 0xFF for b in old))\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))")
# what a copy must not leave: its secrets file (the line "sparkfold:<48 hex>"), the progress runner's log, the
# worker's rsync daemon (or anything else that names the parts' folder)
LEFT_FILES = ("grep -rlsE '^sparkfold:[0-9a-f]{48}$' /tmp /var/tmp; "
              "find /tmp /var/tmp -maxdepth 1 -name 'sparkfold-progress-*'; true")
# (the brackets keep the pattern from matching the shell that runs pgrep)
LEFT_PROCESSES = "pgrep -af '[r]sync --daemon|[s]parkfold-partial' || true"


def serving(sim_exec, role: str) -> bool:
    out = sim_exec(role, ["docker", "inspect", "-f", "{{.State.Running}}", NAME])
    return out.returncode == 0 and out.stdout.strip() == "true"


def sha256(sim_exec, role: str, path: str) -> str:
    out = sim_exec(role, ["sha256sum", path])
    assert out.returncode == 0, out.stderr
    return out.stdout.split()[0]


def size_and_mtime(sim_exec, role: str, path: str) -> str:
    return sim_exec(role, ["stat", "-c", "%s %y", path]).stdout.strip()


def leftovers(sim_exec) -> dict[str, str]:
    found = {role: sim_exec(role, LEFT_FILES).stdout.strip() for role in ("head", "worker")}
    found["worker processes"] = sim_exec("worker", LEFT_PROCESSES).stdout.strip()
    return {where: what for where, what in found.items() if what}


def test_a_damaged_worker_copy_with_its_size_and_mtime_is_removed_then_copied_again(run_pyinfra, sim_exec):
    if not (serving(sim_exec, "head") and serving(sim_exec, "worker")):
        deploy(run_pyinfra)
    good = sha256(sim_exec, "head", DAMAGED)
    before = size_and_mtime(sim_exec, "worker", DAMAGED)
    assert sim_exec("worker", ["python3", "-c", FLIP, DAMAGED]).returncode == 0
    assert sim_exec("worker", ["rm", "-f", MARKER]).returncode == 0
    assert size_and_mtime(sim_exec, "worker", DAMAGED) == before and sha256(sim_exec, "worker", DAMAGED) != good

    # 1. the worker's check finds it: the run fails, naming the file, which is gone from the worker
    run = failing_deploy(run_pyinfra)
    assert "model-00047-of-00048.safetensors: FAILED" in run.stderr, run.stderr[-4000:]
    assert "re-run the deploy to copy them again" in run.stderr, run.stderr[-4000:]
    assert sim_exec("worker", ["test", "-e", DAMAGED]).returncode != 0

    # 2. the next run copies it again and is green
    deploy(run_pyinfra)
    assert sha256(sim_exec, "worker", DAMAGED) == good
    assert chat()["choices"][0]["message"]["content"]


def test_a_copy_leaves_no_temporary_folder_secret_or_listener_on_either_spark(run_pyinfra, sim_exec):
    if not (serving(sim_exec, "head") and serving(sim_exec, "worker")):
        deploy(run_pyinfra)
    # a file the worker lacks, so that this run copies the Engram tables (rsync's daemon, its clients and all)
    probe = f"{ENGRAM}/copy-probe.bin"
    assert sim_exec("head", f"head -c 3M /dev/urandom > {probe} && chown nvidia: {probe}").returncode == 0
    try:
        run = deploy(run_pyinfra)
        assert any(name.endswith("Engram tables to the worker") for name in changed_ops(run)), changed_ops(run)
        assert sha256(sim_exec, "worker", probe) == sha256(sim_exec, "head", probe)
        assert sim_exec("worker", ["test", "-e", f"{ENGRAM}/.sparkfold-partial"]).returncode != 0
        assert leftovers(sim_exec) == {}
    finally:  # back to the pair's own files (the probe is not one of the Engram tables)
        for role in ("head", "worker"):
            sim_exec(role, f"rm -f {probe}")
    deploy(run_pyinfra)
