"""The end-to-end files are split between two simulated pairs (tests/sim/pairs.py): every file lands on exactly one,
the files named for pair A exist, and the fresh-Sparks files lead pair A."""

from __future__ import annotations

from pathlib import Path

from tests.sim import pairs

E2E = Path(__file__).resolve().parents[1] / "e2e"


def test_every_file_named_for_pair_a_exists():
    missing = [name for name in pairs.PAIR_A if not (E2E / name).is_file()]
    assert missing == [], f"tests/sim/pairs.py PAIR_A names files that are gone: {missing}"


def test_each_e2e_file_has_one_pair_and_unit_tests_none():
    files = sorted(p.name for p in E2E.glob("test_*.py"))
    scopes = {name: pairs.e2e_scope(f"tests/e2e/{name}::test_x") for name in files}
    assert set(scopes.values()) == {"tests/e2e (pair A)", "tests/e2e (pair B)"}
    assert scopes["test_deploy.py"] == scopes["test_sim_smoke.py"] == "tests/e2e (pair A)"  # fresh Sparks first
    assert pairs.e2e_scope("tests/unit/test_x.py::test_y") is None
    assert pairs.e2e_scope("tests/e2e/test_deploy.py::test_a[x::y]") == "tests/e2e (pair A)"


def test_a_worker_names_its_pair():
    assert pairs.pair_of_worker("gw0") == "0" and pairs.pair_of_worker("gw12") == "12"
    assert pairs.pair_of_worker("") is None and pairs.pair_of_worker("gwx") is None


def test_two_pairs_share_no_name_port_subnet_or_file():
    """What each pair holds on the machine, read from tests/sim/sim.py as SPARKSIM_PAIR sets it."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    show = ("import json; from tests.sim import sim; print(json.dumps([*sim.CONTAINER.values(), *sim.VOLUME.values(), "
            "sim.NETWORK, sim.NETWORK_SUBNET, *map(str, sim.SSH_PORT.values()), str(sim.API_PORT), str(sim.SITE_FILE), "
            "str(sim.KNOWN_HOSTS), str(sim._meminfo_path('head')), "
            "*(end for i in range(2) for end in sim._link_ends(i))]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_")}
    held = [set(json.loads(subprocess.run([sys.executable, "-c", show], cwd=root, env={**env, "SPARKSIM_PAIR": n},
                                          capture_output=True, text=True, check=True).stdout)) for n in ("0", "1")]
    assert held[0] & held[1] == set()
    assert "sparkfold-sim-head" in held[0]  # pair 0 keeps the plain names (a pair brought up before still matches)
