"""How open rank 0's API is (operations/rank/exposure.py), and what a rollback says and refuses when the pair it
brings back is more open than the settings ask (issue 27's Medium finding: a rollback silently reopened the API)."""

from __future__ import annotations

import pytest
from settings_factory import make_pair
from test_rank_generation import EARLIER, HS, READY, SERVING, WS, good, rollback_op, running_pair
from test_rank_switch import serve

from operations.rank import exposure
from operations.rank.exposure import Exposure


def test_the_argv_says_whether_a_key_is_asked_and_where_it_listens():
    assert exposure.of_argv(["serve", "--host", "127.0.0.1", "--api-key-file", "/k"]) == Exposure(True, "127.0.0.1")
    assert exposure.of_argv(["serve", "--port", "8888"]) == Exposure(False, "0.0.0.0")  # the engine's default


@pytest.mark.parametrize(("serving", "asked", "said"), [
    (Exposure(False, "0.0.0.0"), Exposure(True, "0.0.0.0"), ["without a key"]),
    (Exposure(True, "0.0.0.0"), Exposure(True, "127.0.0.1"), ["listens on 0.0.0.0, while the settings ask for "
                                                              "127.0.0.1"]),
    (Exposure(True, "192.168.1.5"), Exposure(True, "127.0.0.1"), ["listens on 192.168.1.5"]),
    (Exposure(False, "0.0.0.0"), Exposure(True, "10.0.0.1"), ["without a key", "listens on 0.0.0.0"]),
    (Exposure(True, "0.0.0.0"), Exposure(False, "0.0.0.0"), []),  # more closed than asked: nothing to say
    (Exposure(True, "127.0.0.1"), Exposure(True, "0.0.0.0"), []),
    (Exposure(True, "10.0.0.2"), Exposure(True, "10.0.0.1"), []),  # another single address: as wide
])
def test_more_open_names_each_way_the_serving_api_is_wider(serving, asked, said):
    found = exposure.more_open(serving, asked)
    assert len(found) == len(said) and all(part in line for part, line in zip(said, found, strict=True))


KEYED_HEAD, _ = make_pair(head={"nccl_rails": 1, "api_key": True}, worker={"nccl_rails": 1, "api_key": True})


def test_an_automatic_rollback_to_a_keyless_pair_says_the_api_is_open_and_how_to_close_it(monkeypatch):
    # the settings turned api_key on; the new (keyed) engine failed; EARLIER, recorded keyless, serves again
    ok, logged, _calls = serve(monkeypatch, problem="rank 0 exited with code 1", settings=KEYED_HEAD)
    assert not ok
    assert f"Generation {EARLIER.id} serves again (rolled back)" in logged[-1]
    assert "⚠ Beware: " in logged[-1] and "the API answers without a key, while the settings ask for one" in logged[-1]
    assert "stop.py stops both ranks" in logged[-1]
    live = [line for line in logged if "LIVE" in line or "⚠ the API has no key" in line]
    assert live[0].startswith("✔ DeepSeek-V4.1-Flash-1017 is now LIVE!")
    assert any("the API has no key and listens on 0.0.0.0:8888" in line for line in live)


def test_an_automatic_rollback_as_closed_as_the_settings_warns_of_nothing(monkeypatch):
    ok, logged, _calls = serve(monkeypatch, problem="rank 0 exited with code 1", settings=HS.replace(host="0.0.0.0"))
    assert not ok and "Beware" not in logged[-1]


def test_rollback_py_starts_a_generation_more_open_than_the_settings_when_rollback_open_says_so():
    """Without rollback_open the rollback is refused (tests/operations/ranks.rollback_checked/
    more_open_api_refused_without_rollback_open.json); with it, the switch is planned."""
    mine = running_pair(HS, good(EARLIER, 1), good(SERVING, 2), last_good=SERVING.id)
    keyed = HS.replace(api_key=True, rollback_open=True)
    cmds, (plan, target) = rollback_op(mine, running_pair(WS), READY, READY, s=keyed)
    assert cmds == [] and target.id == EARLIER.id and plan.stale
