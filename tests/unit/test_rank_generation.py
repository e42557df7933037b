"""Generations (operations/rank/generation.py): records, what a switch changes, what is kept and pruned; and the
operations of the pair step that write and prune them (operations/ranks.py)."""

from __future__ import annotations

import json

import pytest
from harness import FakeHost, run_op
from rank_inputs import IMAGE, TEMPLATE, container, found, pair_plans, rank_facts
from settings_factory import make_pair

from operations import ranks
from operations.facts.rank import PruneInputs, parse_generation_files
from operations.rank import generation as gen
from operations.rank.plan import pair_plan

HS, WS = make_pair(head={"nccl_rails": 1}, worker={"nccl_rails": 1})


def generation_for(image=IMAGE, commit="abc", data_dir_real="", **settings) -> gen.Generation:
    """The pair a deploy of `commit` makes; data_dir_real: where data_dir really is when it is reached through a
    symlink (the rank step reads its mounts' real paths)."""
    hs, ws = make_pair(head={"nccl_rails": 1, **settings}, worker={"nccl_rails": 1, **settings})
    head_in, worker_in = found(hs), found(ws)
    for f, s in ((head_in, hs), (worker_in, ws)):
        f["served"] = f"{s.layout.model_folder}/snapshots/{commit}"
        f["rank_folder"] = f"{s.layout.rank_cache}/{commit}/rank{s.rank}"
        if data_dir_real:
            for key in ("kit", "rank_folder"):
                f[key] = f[key].replace(s.layout.data_dir, data_dir_real, 1)
    wanted = pair_plan(hs, ws, head_in, worker_in, image=image, template_digest=TEMPLATE, force=False).wanted
    assert wanted is not None
    return wanted


OLD, NEW = generation_for(), generation_for(image="sparkfold/dsv41-tf:def", commit="def")


def records(*generations: gen.Generation, last_good: str = "") -> gen.Records:
    return gen.Records(tuple(generations), last_good)


def good(g: gen.Generation, at: float) -> gen.Generation:
    return gen.Generation(g.id, g.specs, good_at=at)


# --- records -----------------------------------------------------------------------------------------------------

def test_a_record_reads_back_as_the_same_generation():
    text = json.dumps(good(OLD, 5.0).record())
    back = gen.read_record(text)
    assert back == good(OLD, 5.0) and back.specs[0].spec_hash() == OLD.specs[0].spec_hash()
    assert len(OLD.id) == 8 and OLD.id != NEW.id


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"kind": "other"}),
                                  json.dumps({**OLD.record(), "id": "deadbeef"})])  # an id its specs do not make
def test_anything_but_a_whole_record_is_ignored(text):
    assert gen.read_record(text) is None


def test_records_come_from_the_folder_listing():
    files = {f"{OLD.id}.json": json.dumps(good(OLD, 1).record()), "notes.txt": "x",
             "renamed.json": json.dumps(good(NEW, 2).record())}  # a record under another name is not trusted
    found_records = gen.read_records(files, f"{OLD.id}\n")
    assert [g.id for g in found_records.generations] == [OLD.id] and found_records.last_good == OLD.id


def test_the_fact_section_reads_each_record_and_last_good():
    import base64
    text = json.dumps(OLD.record())
    lines = [f"#FILE {OLD.id}.json", base64.b64encode(text.encode()).decode(), "#FILE cut.json", "%%%",
             f"#LAST {OLD.id}", "#NOW 1700000000"]
    assert parse_generation_files(lines) == {"files": {f"{OLD.id}.json": text}, "last_good": OLD.id,
                                             "now": 1700000000.0}


# --- what a switch changes -----------------------------------------------------------------------------------------

def test_changes_name_the_parts_that_differ():
    assert gen.changes(OLD, NEW) == ["image", "model revision", "weight files"]
    assert gen.changes(OLD, generation_for(context=65536)) == ["settings"]
    assert gen.changes(OLD, OLD) == []


def test_the_switch_line_says_from_what_to_what_and_the_way_back():
    image = NEW.specs[0].image
    line = gen.switch_of(NEW.specs, image, records(good(OLD, 1), last_good=OLD.id)).line()
    assert line == (f"generation {OLD.id} → {NEW.id}: image, model revision, weight files; rollback to {OLD.id} if "
                    "the new pair fails")
    first = gen.switch_of(NEW.specs, image, records())
    assert first.came_from is None and first.first and "nothing to roll back to" in first.line()
    again = gen.switch_of(OLD.specs, IMAGE, records(good(OLD, 1), last_good=OLD.id))
    assert again.came_from is None and not again.first and "starts again" in again.line()


def test_a_switch_to_an_image_not_built_yet_is_said_from_what_is_known():
    # --dry before a new image exists: rank 0's spec waits for the image's capabilities
    unknown = gen.switch_of([None, NEW.specs[1]], NEW.specs[0].image, records(good(OLD, 1), last_good=OLD.id))
    assert unknown.to is None and unknown.changed == ("image", "weight files")
    assert unknown.line().startswith(f"generation {OLD.id} → a new one (its id is known once the steps before it")
    assert unknown.line().endswith(f"; rollback to {OLD.id} if the new pair fails")


def test_previous_is_the_newest_good_one_but_the_current():
    found_records = records(good(OLD, 1), good(NEW, 2), last_good=NEW.id)
    assert found_records.previous(NEW.id) == good(OLD, 1) and found_records.previous(OLD.id) == good(NEW, 2)
    assert records(good(OLD, 1)).previous(OLD.id) is None


# --- keeping and pruning ---------------------------------------------------------------------------------------------

THIRD = generation_for(image="sparkfold/dsv41-tf:ghi", commit="ghi")
RANK_CACHE = HS.layout.rank_cache
KIT_D = f"{HS.layout.kit}.d"


def prune(keep: int, serving: gen.Generation, *generations: gen.Generation, images=(), in_use=(), entries=None,
          real=None):
    folders = entries if entries is not None else {"weights": (RANK_CACHE, ["abc", "def", "ghi"]),
                                                   "kit": (KIT_D, ["0123abcd"])}
    return gen.prune_plan(records(*generations, last_good=generations[-1].id if generations else ""), keep, serving,
                          0, folders, list(images), list(in_use), real=real)


def test_keep_two_removes_the_third_oldest_only():
    plan = prune(2, THIRD, good(OLD, 1), good(NEW, 2), images=[IMAGE, NEW.specs[0].image, THIRD.specs[0].image])
    assert plan.records == (OLD.id,) and plan.folders == (f"{RANK_CACHE}/abc",) and plan.images == (IMAGE,)


def test_keep_one_keeps_only_the_serving_generation():
    plan = prune(1, THIRD, good(OLD, 1), good(NEW, 2), images=[IMAGE, NEW.specs[0].image, THIRD.specs[0].image])
    assert set(plan.records) == {OLD.id, NEW.id}
    assert plan.folders == (f"{RANK_CACHE}/abc", f"{RANK_CACHE}/def")
    assert set(plan.images) == {IMAGE, NEW.specs[0].image}


def test_the_serving_generation_is_kept_before_its_record_is_written():
    plan = prune(1, NEW, good(OLD, 5))  # planned: NEW is recorded only once it serves
    assert plan.records == (OLD.id,) and f"{RANK_CACHE}/def" not in plan.folders


def test_never_a_folder_moved_aside_an_image_in_use_or_the_kit_a_kept_one_uses():
    entries = {"weights": (RANK_CACHE, ["abc", "def", "replaced-20261204-101010"]),
               "kit": (KIT_D, ["0123abcd", "ffff0000"])}
    plan = prune(1, NEW, good(OLD, 1), images=[IMAGE], in_use=[IMAGE], entries=entries)
    assert plan.folders == (f"{KIT_D}/ffff0000", f"{RANK_CACHE}/abc") and plan.images == ()
    assert not gen.prune_plan(records(good(NEW, 1), last_good=NEW.id), 2, NEW, 0,
                              {"weights": (RANK_CACHE, ["def"])}, [], [])


# data_dir moved to a larger disk and reached through a symlink: the ranks mount real paths, the settings spell
# the link. /home/... -> /mnt/big/sparkfold
REAL_DATA = "/mnt/big/sparkfold"
S_OLD, S_NEW, S_THIRD = (generation_for(data_dir_real=REAL_DATA),
                         generation_for(image="sparkfold/dsv41-tf:def", commit="def", data_dir_real=REAL_DATA),
                         generation_for(image="sparkfold/dsv41-tf:ghi", commit="ghi", data_dir_real=REAL_DATA))
REAL_CACHE, REAL_KIT_D = RANK_CACHE.replace(HS.layout.data_dir, REAL_DATA), KIT_D.replace(HS.layout.data_dir, REAL_DATA)


def test_with_data_dir_through_a_symlink_only_what_no_kept_generation_uses_is_pruned():
    """The High finding of issue 27: the folders listed were spelled from the settings and never matched the
    mounts' real paths, so the serving pair's weight folder and kit were removed. Both are compared as real paths
    now, and removed by their real paths."""
    entries = {"weights": (REAL_CACHE, ["abc", "def", "ghi"]), "kit": (REAL_KIT_D, ["0123abcd", "ffff0000"])}
    plan = prune(2, S_THIRD, good(S_OLD, 1), good(S_NEW, 2), entries=entries)
    assert plan.folders == (f"{REAL_KIT_D}/ffff0000", f"{REAL_CACHE}/abc") and not plan.refused
    assert plan.records == (S_OLD.id,)


def test_mounts_recorded_through_a_symlink_are_compared_by_where_they_lead():
    # records written before data_dir moved spell the old path, which the Spark resolves to the new one
    spelled = f"{RANK_CACHE}/def"
    entries = {"weights": (REAL_CACHE, ["abc", "def", "ghi"]), "kit": (REAL_KIT_D, ["0123abcd"])}
    real = {spelled: f"{REAL_CACHE}/def", f"{KIT_D}/0123abcd": f"{REAL_KIT_D}/0123abcd"}
    plan = prune(2, S_THIRD, good(S_OLD, 1), good(NEW, 2), entries=entries, real=real)
    assert plan.folders == (f"{REAL_CACHE}/abc",)


def test_when_the_serving_mounts_are_not_among_the_listed_folders_nothing_is_pruned():
    # the listing is spelled one way and the mounts another, with no resolution to tie them: never guess
    plan = prune(1, S_THIRD, good(S_OLD, 1), good(S_NEW, 2), images=[IMAGE])
    assert not plan and plan.folders == () and plan.records == () and plan.images == ()
    assert f"the serving rank's weight folder {REAL_CACHE}/ghi" in plan.refused
    assert f"not among the entries of {RANK_CACHE}" in plan.refused and "nothing is pruned" in plan.refused


def test_the_paths_to_resolve_are_every_recorded_mount_of_this_rank():
    paths = gen.prune_paths(records(good(OLD, 1), good(S_NEW, 2)), S_THIRD, 0)
    assert f"{RANK_CACHE}/abc" in paths and f"{REAL_CACHE}/def" in paths and f"{REAL_CACHE}/ghi" in paths
    assert f"{KIT_D}/0123abcd" in paths and f"{REAL_KIT_D}/0123abcd" in paths


# --- the operations ------------------------------------------------------------------------------------------------

def inputs_with_records(s, container_, *generations, last_good=""):
    found_ = found(s, container_)
    found_["generations"] = {"files": {f"{g.id}.json": json.dumps(g.record()) for g in generations},
                             "last_good": last_good}
    return found_


SERVING = OLD  # what found() makes: the generation the pair in these tests runs
EARLIER = NEW  # another generation, recorded before it


def kept_op(mine, theirs, prune_inputs=None, executing=True, s=HS, image=IMAGE):
    facts = rank_facts(mine, {PruneInputs: prune_inputs or PruneInputs.default()})
    peer = FakeHost(rank_facts(theirs), name="peer")
    return run_op(ranks.generations_kept, facts, executing=executing, plans=pair_plans(s, peer, image))


def running_pair(s, *generations, last_good=""):
    rank_hash = SERVING.specs[s.rank].spec_hash()
    return inputs_with_records(s, container(rank_hash), *generations, last_good=last_good)


def test_the_serving_generation_is_recorded_as_last_good_as_root():
    cmds, _ = kept_op(running_pair(HS), running_pair(WS))
    assert len(cmds) == 1 and cmds[0].startswith("sudo") is False and f"{SERVING.id}.json" in cmds[0]
    assert f"> {HS.layout.generations}/.last-good.tmp" in cmds[0].replace("'\"'\"'", "'")
    assert '"kind": "sparkfold-generation"' in cmds[0]


def test_a_switch_of_rank_0_alone_is_recorded_on_the_worker_too():
    """The worker's rank is as the last good generation had it (only rank 0's spec changed), but the pair is another
    generation: the worker records it too (judged by the pair's generation, not by one rank's container)."""
    mixed_specs = (EARLIER.specs[0], SERVING.specs[1])  # rank 0 as EARLIER, rank 1 as the pair runs it now
    mixed = gen.Generation(gen.generation_id([spec.spec_hash() for spec in mixed_specs]), mixed_specs, good_at=1.0)
    worker = running_pair(WS, mixed, last_good=mixed.id)
    cmds, _ = kept_op(worker, running_pair(HS), s=WS)
    assert len(cmds) == 1 and f"{SERVING.id}.json" in cmds[0]
    cmds, _ = kept_op(running_pair(WS, good(SERVING, 2), last_good=SERVING.id), running_pair(HS), s=WS)
    assert cmds == []  # recorded: converged


def test_old_generations_are_pruned_once_a_new_one_is_recorded():
    prune_inputs = {"images": [IMAGE, EARLIER.specs[0].image], "in_use": [], "real": {},
                    "folders": {HS.layout.rank_cache: {"real": HS.layout.rank_cache, "names": ["abc", "def"]}}}
    switched = running_pair(HS, good(EARLIER, 1), last_good=EARLIER.id)  # the pair now runs SERVING
    cmds, _ = kept_op(switched, running_pair(WS), prune_inputs=prune_inputs, s=HS.replace(keep_generations=1))
    assert f"{SERVING.id}.json" in cmds[0] and cmds[1:] == [
        f"rm -rf -- {HS.layout.rank_cache}/def",  # abc is the serving one's weight folder
        f"docker image rm {EARLIER.specs[0].image} >/dev/null", f"rm -f -- {HS.layout.generations}/{EARLIER.id}.json"]
    cmds, _ = kept_op(switched, running_pair(WS), prune_inputs=prune_inputs, s=HS.replace(keep_generations=2))
    assert len(cmds) == 1  # the record only: two generations are kept


def test_the_old_pair_is_recorded_for_the_exact_gate_only_when_it_serves():
    notes = ranks.SwitchNotes()
    serving_old = (inputs_with_records(HS, container(EARLIER.specs[0].spec_hash()), good(EARLIER, 1),
                                       last_good=EARLIER.id),
                   inputs_with_records(WS, container(EARLIER.specs[1].spec_hash())))
    peer = FakeHost(rank_facts(serving_old[1]), name="peer")
    cmds, _ = run_op(ranks.old_pair_replayed, rank_facts(serving_old[0]), executing=True, plans=pair_plans(HS, peer),
                     notes=notes)
    assert len(cmds) == 1 and "_old_pair_recorded" in cmds[0]


# --- rollback.py ------------------------------------------------------------------------------------------------------

def rollback_op(mine, theirs, ready_head, ready_worker, executing=True, s=HS, op=None, **kwargs):
    """An operation of rollback.py on the head (rollback_checked unless `op`): (commands, the plan it read)."""
    from operations.facts.rank import StartReady
    peer = FakeHost(rank_facts(theirs, {StartReady: ready_worker}), name="peer")
    plans = pair_plans(s, peer, rollback=True)
    cmds, _ = run_op(op or ranks.rollback_checked, rank_facts(mine, {StartReady: ready_head}), executing=executing,
                     plans=plans, **kwargs)
    return cmds, _planned(plans, executing)


def _planned(plans, executing):
    """The plan before the stop the operation judged (rollback.py's, retargeted), and its rollback target."""
    choice = plans._rollback[executing]
    from operations.rank.plan import retargeted
    return retargeted(plans._read[(ranks.BEFORE_STOP, executing)], choice.target), choice.target


READY = {"image": True, "missing": []}


def test_rollback_switches_to_the_newest_good_generation_but_the_serving_one():
    mine = running_pair(HS, good(EARLIER, 1), good(SERVING, 2), last_good=SERVING.id)
    cmds, (plan, target) = rollback_op(mine, running_pair(WS), READY, READY)
    assert cmds == [] and target.id == EARLIER.id  # checked: nothing to do here
    # deploy.py's own stop and start, of the record's specs: the plan wants the target
    assert plan.stale and plan.wanted.id == EARLIER.id and plan.rank(0).spec == EARLIER.specs[0]
    stop, _ = rollback_op(mine, running_pair(WS), READY, READY, op=ranks.stale_pair_stopped)
    assert any(c.startswith("docker stop") for c in stop), stop
    start, _ = rollback_op(mine, running_pair(WS), READY, READY, op=ranks.rank_started, executing=False)
    assert any(f"sparkfold.spec-hash={EARLIER.specs[0].spec_hash()}" in c for c in start), start


def test_rollback_with_nothing_serving_starts_the_last_good_generation():
    stopped = inputs_with_records(HS, {}, good(EARLIER, 1), good(SERVING, 2), last_good=SERVING.id)
    cmds, (_plan, target) = rollback_op(stopped, inputs_with_records(WS, {}), READY, READY)
    assert cmds == [] and target.id == SERVING.id


def test_a_refused_rollback_plans_no_stop_or_start_on_either_spark():
    alone = running_pair(HS, good(SERVING, 2), last_good=SERVING.id)  # nothing earlier served
    for op in (ranks.stale_pair_stopped, ranks.rank_started):
        cmds, (plan, target) = rollback_op(alone, running_pair(WS), READY, READY, op=op, executing=False)
        assert cmds == [] and target is None and not plan.stale


def test_nothing_started_since_the_check_asks_nothing():
    from types import SimpleNamespace
    recorded = good(SERVING, 3)
    checked = pair_plans(HS, FakeHost(rank_facts(running_pair(WS)), name="peer"))
    _cmds, _host = run_op(ranks.pair_checked, rank_facts(running_pair(HS, recorded, last_good=SERVING.id)),
                          executing=True, plans=checked)
    idle = SimpleNamespace(is_complete=lambda: True, did_change=lambda: False, will_change=False)
    cmds, host = run_op(ranks.generations_kept, {}, executing=True, plans=checked, started=idle)
    assert cmds == [] and host.fact_calls == [] and host.noops == ["this rank runs the last good generation"]
    started = SimpleNamespace(is_complete=lambda: True, did_change=lambda: True, will_change=True)
    facts = rank_facts(running_pair(HS, recorded, last_good=SERVING.id))
    cmds, host = run_op(ranks.generations_kept, facts, executing=True, plans=checked, started=started)
    assert host.fact_calls  # started in this run: this Spark is asked again, after the gate


def symlinked(s, generation, *generations, last_good=""):
    """RankInputs of `s` running `generation`, with data_dir reached through a symlink to REAL_DATA."""
    mine = inputs_with_records(s, container(generation.specs[s.rank].spec_hash()), *generations, last_good=last_good)
    for key in ("kit", "rank_folder"):
        mine[key] = mine[key].replace(s.layout.data_dir, REAL_DATA, 1)
    return mine


def test_the_prune_operation_removes_by_real_paths_what_the_spark_resolved():
    # a first switch on a symlinked data_dir: S_OLD served, S_NEW now serves, keep_generations = 1
    mine = symlinked(HS, S_NEW, good(S_OLD, 1), last_good=S_OLD.id)
    mine["served"] = f"{HS.layout.model_folder}/snapshots/def"
    mine["rank_folder"] = f"{REAL_CACHE}/def/rank0"
    theirs = symlinked(WS, S_NEW)
    theirs["served"] = f"{WS.layout.model_folder}/snapshots/def"
    theirs["rank_folder"] = f"{WS.layout.rank_cache.replace(WS.layout.data_dir, REAL_DATA)}/def/rank1"
    kit_d = f"{HS.layout.kit}.d"
    prune_inputs = {"images": [], "in_use": [], "real": {f"{REAL_CACHE}/abc": f"{REAL_CACHE}/abc"},
                    "folders": {HS.layout.rank_cache: {"real": REAL_CACHE, "names": ["abc", "def"]},
                                kit_d: {"real": REAL_KIT_D, "names": ["0123abcd"]}}}
    cmds, host = kept_op(mine, theirs, prune_inputs=prune_inputs, s=HS.replace(keep_generations=1),
                         image="sparkfold/dsv41-tf:def")
    assert f"{S_NEW.id}.json" in cmds[0] and f"rm -rf -- {REAL_CACHE}/abc" in cmds
    assert not any(f"{REAL_CACHE}/def" in c or "0123abcd" in c for c in cmds[1:])
    asked = [kwargs for name, kwargs in host.fact_calls if name.endswith("PruneInputs")]
    assert asked and f"{REAL_CACHE}/def" in asked[0]["paths"] and HS.layout.rank_cache in asked[0]["folders"]


def test_the_prune_fact_reads_real_paths_and_entries():
    lines = ["#IMAGE sparkfold/dsv41-tf:abc", "#USED sparkfold/dsv41-tf:abc",
             f"#FOLDER {RANK_CACHE}\t{REAL_CACHE}", "abc", "def", f"#FOLDER {KIT_D}\t",
             f"#REAL {RANK_CACHE}/abc\t{REAL_CACHE}/abc", f"#REAL {RANK_CACHE}/gone\t"]
    assert PruneInputs().process(lines) == {
        "images": ["sparkfold/dsv41-tf:abc"], "in_use": ["sparkfold/dsv41-tf:abc"],
        "folders": {RANK_CACHE: {"real": REAL_CACHE, "names": ["abc", "def"]}, KIT_D: {"real": "", "names": []}},
        "real": {f"{RANK_CACHE}/abc": f"{REAL_CACHE}/abc", f"{RANK_CACHE}/gone": ""}}
