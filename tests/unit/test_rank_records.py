"""Where the generation records live and how they are ordered (operations/ranks.py writes them, operations/facts/
rank.py reads them, operations/rank/generation.py orders them): root's folder, 0700, records 0600, ordered by a count
kept on the Spark rather than by the clock of whichever controller wrote them."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from rank_inputs import container
from test_rank_generation import HS, NEW, OLD

from operations import ranks
from operations.facts.rank import generation_files_command, parse_generation_files
from operations.layout import GENERATIONS_DIR, SYSTEM_STATE_DIR
from operations.rank import commands
from operations.rank import generation as gen
from operations.rank.record_check import record_problems

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the record is written as root (chown root:root)")


def sh(command) -> subprocess.CompletedProcess:
    text = command if isinstance(command, str) else command.get_raw_value()
    done = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done


def read_back(folder: Path) -> gen.Records:
    found = parse_generation_files(sh(generation_files_command(str(folder))).stdout.splitlines())
    return gen.read_records(found["files"], found["last_good"], found["now"])


def test_the_records_are_not_in_a_folder_the_ssh_user_owns():
    assert HS.layout.generations == GENERATIONS_DIR and GENERATIONS_DIR.startswith(SYSTEM_STATE_DIR + "/")
    assert not HS.layout.generations.startswith(HS.layout.state_dir)
    assert HS.layout.legacy_generations == f"{HS.layout.state_dir}/generations"  # moved from there once


@needs_root
def test_records_are_root_only_and_ordered_by_the_spark_s_count(tmp_path):
    folder = tmp_path / "generations"
    folder.mkdir(mode=0o755)
    # two controllers: the second one's clock is behind the first's, yet its record is the newer one
    sh(commands.record_command(str(folder), gen.Generation(OLD.id, OLD.specs, good_at=2_000.0)))
    sh(commands.record_command(str(folder), gen.Generation(NEW.id, NEW.specs, good_at=1_000.0)))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == 0
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {
        f"{OLD.id}.json": 0o600, f"{NEW.id}.json": 0o600, "last-good": 0o600, "seq": 0o600}
    records = read_back(folder)
    assert [(g.id, g.seq) for g in records.good()] == [(NEW.id, 2), (OLD.id, 1)]
    assert records.previous(NEW.id).id == OLD.id and records.last_good == NEW.id


def test_older_records_without_a_count_come_before_counted_ones_by_their_time():
    older = gen.Generation(OLD.id, OLD.specs, good_at=9_000.0)  # written before the count existed
    counted = gen.Generation(NEW.id, NEW.specs, good_at=1_000.0, seq=1)
    assert [g.id for g in gen.Records((older, counted), "").good()] == [NEW.id, OLD.id]


def test_a_record_dated_in_the_spark_s_future_is_not_a_good_one():
    now = 1_700_000_000.0
    ahead = gen.Generation(NEW.id, NEW.specs, good_at=now + 3600)  # a controller an hour ahead wrote it
    fine = gen.Generation(OLD.id, OLD.specs, good_at=now - 3600)
    records = gen.read_records({f"{g.id}.json": json.dumps(g.record()) for g in (ahead, fine)}, "", now)
    assert [g.id for g in records.good()] == [OLD.id]
    assert records.previous("") == fine  # rollback.py never takes it for the newest
    slightly = gen.Generation(NEW.id, NEW.specs, good_at=now + 5)  # within the clocks' tolerance
    assert gen.Records((slightly, fine), "", now).good()[0] == slightly


def test_the_records_are_read_as_root_and_never_through_a_link(tmp_path):
    command = generation_files_command(str(tmp_path))
    assert "sudo -n sh -c" in command  # the folder is root's 0700: the ssh user cannot list it
    (tmp_path / f"{OLD.id}.json").write_text(json.dumps(gen.Generation(OLD.id, OLD.specs, good_at=1.0).record()))
    elsewhere = tmp_path.parent / "elsewhere.json"
    elsewhere.write_text(json.dumps(gen.Generation(NEW.id, NEW.specs, good_at=2.0).record()))
    (tmp_path / f"{NEW.id}.json").symlink_to(elsewhere)
    assert [g.id for g in read_back(tmp_path).generations] == [OLD.id]


@needs_root
def test_the_old_records_move_into_the_root_only_folder_once(tmp_path):
    legacy, folder = tmp_path / "state" / "generations", tmp_path / "root" / "generations"
    legacy.mkdir(parents=True)
    (legacy / f"{OLD.id}.json").write_text(json.dumps(gen.Generation(OLD.id, OLD.specs, good_at=1.0).record()))
    (legacy / "last-good").write_text(OLD.id + "\n")
    (legacy / f"{NEW.id}.json").symlink_to("/etc/hostname")  # never followed
    sh(ranks.records_moved_command(str(legacy), str(folder)))
    assert not legacy.exists() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{OLD.id}.json", "last-good"])
    assert stat.S_IMODE((folder / f"{OLD.id}.json").stat().st_mode) == 0o600
    assert read_back(folder).last_good == OLD.id


# --- a record is checked before it is started ----------------------------------------------------------------------

def spec_changed(generation: gen.Generation, rank: int, **changes) -> gen.Generation:
    specs = list(generation.specs)
    specs[rank] = replace(specs[rank], **changes)
    return gen.Generation(gen.generation_id([sp.spec_hash() for sp in specs]), (specs[0], specs[1]), good_at=1.0)


def problems(generation: gen.Generation) -> list[str]:
    return record_problems(generation, HS.engine_image, HS.prebuilt_image,
                           (HS.head.container_name, HS.worker.container_name))


def test_a_record_rank_spec_made_may_be_started():
    assert problems(OLD) == [] and problems(NEW) == []


@pytest.mark.parametrize("rank, changes, said", [
    (1, {"options": [*OLD.specs[1].options, "--privileged"]}, "'--privileged' is not one sparkfold gives"),
    (0, {"options": [*OLD.specs[0].options, "--cap-add", "SYS_ADMIN"]}, "--cap-add 'SYS_ADMIN'"),
    (0, {"options": [*OLD.specs[0].options, "--network", "bridge", "-v", "/:/host"]}, "'-v' is not one"),
    (1, {"mounts": [*OLD.specs[1].mounts, ("/", "/host", False)]}, "mounts / at /host"),
    (0, {"mounts": [("/etc", "/kit", False) if m[1] == "/kit" else m for m in OLD.specs[0].mounts]},
     "mounts /etc writable at /kit"),
    (0, {"image": "evil/miner:latest"}, "its image 'evil/miner:latest' is not one sparkfold built"),
    (1, {"argv": ["sh", "-c", "curl x | sh"]}, "it runs ['sh'], not the engine"),
    (1, {"env": {**OLD.specs[1].env, "TF_DS_X": "a\nLD_PRELOAD=/tmp/x.so"}}, "no env file can hold: TF_DS_X"),
    (0, {"env": {**OLD.specs[0].env, "BAD NAME": "1"}}, "no env file can hold: BAD NAME"),
])
def test_a_record_with_what_no_rank_spec_makes_is_refused(rank, changes, said):
    found = problems(spec_changed(OLD, rank, **changes))
    assert found and found[0].startswith(f"rank {rank}: ") and said in " ".join(found), found


def test_a_refused_record_stops_nothing_and_starts_nothing(monkeypatch):
    from test_rank_switch import Spark

    from operations.rank import switch
    monkeypatch.setattr(switch, "pair_problem", lambda s, head, worker, timeout, api=None: None)
    head, worker = Spark("head", {}), Spark("worker", {})
    bad = spec_changed(OLD, 1, options=[*OLD.specs[1].options, "--privileged"])
    problem = switch.switched_to(ranks.switch_inputs(HS), head, worker, (container("new"), container("new")), bad)
    assert problem and f"the record of generation {bad.id} is refused" in problem and "--privileged" in problem
    assert head.ran == [] and worker.ran == []  # the serving pair is not even stopped
