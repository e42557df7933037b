"""The end-to-end files are split among the simulated pairs (tests/sim/pairs.py): every file lands on exactly one,
the files named for pair A exist, and the fresh-Sparks files lead pair A."""

from __future__ import annotations

from pathlib import Path

from tests.sim import pairs

E2E = Path(__file__).resolve().parents[1] / "e2e"


def test_every_file_a_group_names_exists_and_is_in_one_group():
    named = [name for files in pairs.GROUPS for name in files]
    missing = [name for name in named if not (E2E / name).is_file()]
    assert missing == [], f"tests/sim/pairs.py GROUPS names files that are gone: {missing}"
    assert len(named) == len(set(named)), "a file in two groups"


def test_each_e2e_file_has_one_pair_and_unit_tests_none():
    files = sorted(p.name for p in E2E.glob("test_*.py"))
    scopes = {name: pairs.e2e_scope(f"tests/e2e/{name}::test_x") for name in files}
    assert set(scopes.values()) == {f"tests/e2e (pair group {n})" for n in range(pairs.PAIRS)}
    assert scopes["test_deploy.py"] == scopes["test_sim_smoke.py"] == "tests/e2e (pair group 0)"  # fresh Sparks
    assert scopes["test_overlap.py"] == f"tests/e2e (pair group {pairs.PAIRS - 1})"  # unnamed: the last group
    assert pairs.e2e_scope("tests/unit/test_x.py::test_y") is None
    assert pairs.e2e_scope("tests/e2e/test_deploy.py::test_a[x::y]") == "tests/e2e (pair group 0)"


def test_a_worker_names_its_pair():
    assert pairs.pair_of_worker("gw0") == "0" and pairs.pair_of_worker("gw12") == "12"
    assert pairs.pair_of_worker("") is None and pairs.pair_of_worker("gwx") is None


def test_the_pairs_share_no_name_port_subnet_or_file():
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
                                          capture_output=True, text=True, check=True).stdout))
            for n in map(str, range(pairs.PAIRS))]
    assert len(held) >= 2
    for a in range(len(held)):
        for b in range(a + 1, len(held)):
            assert held[a] & held[b] == set(), (a, b)
    assert "sparkfold-sim-head" in held[0]  # pair 0 keeps the plain names (a pair brought up before still matches)


def test_pytest_has_a_worker_per_pair_and_one_for_the_unit_tests():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["tool"]["pytest"]["ini_options"]["addopts"] == f"-n {pairs.PAIRS + 1}"
