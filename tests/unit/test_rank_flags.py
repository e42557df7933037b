"""flags_check: rank 0's argv against capabilities documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from settings_factory import make_settings

from operations.rank.flags import check_ported_settings, check_serve_argv
from operations.rank.spec import rank0_argv

STANDIN = Path(__file__).resolve().parents[2] / "tests" / "sim" / "engine" / "bin" / "tensorfold-native"
NATIVE = ["--host", "--port", "--name", "--alias", "--api-key", "--api-key-file", "--context", "--max-tokens",
          "--temperature", "--top-p", "--top-k", "--thinking", "--no-thinking", "--no-drafts", "--parallel"]


def doc(extra_flags=None, families=None, drop=()):
    flags = {f: {} for f in NATIVE if f not in drop}
    flags["--reasoning-effort"] = {"values": ["low", "medium", "high", "xhigh"]}
    flags["--backend"] = {"values": ["auto", "cuda"]}
    flags.update(extra_flags or {})
    return {"schema": 1, "engine": "zig", "version": "1.0.2", "chip": None, "backends": ["cuda"],
            "families": families if families is not None else {"deepseek_v41": ["exl3-mul1"]},
            "serve": {"flags": flags}, "env": []}


def argv(**kw):
    return rank0_argv(make_settings("head", **kw), "/snap", doc())


def test_default_argv_passes():
    assert check_serve_argv(argv(), doc()) == []
    assert check_serve_argv(argv(thinking=False, drafts=False, api_key=True, reasoning_effort="high"), doc()) == []


def test_unknown_extra_flag_names_the_fix():
    problems = check_serve_argv(argv(extra_serve_args=["--kv-dtype", "fp8"]), doc())
    assert problems == ["--kv-dtype is not served by this engine image (1.0.2): remove --kv-dtype from "
                        "extra_serve_args"]


def test_unknown_switch_and_inline_value():
    assert "--foo is not served" in check_serve_argv(argv(extra_serve_args=["--foo"]), doc())[0]
    assert "--bar is not served" in check_serve_argv(argv(extra_serve_args=["--bar=1"]), doc())[0]


def test_value_outside_listed_values():
    problems = check_serve_argv(argv(extra_serve_args=["--backend", "metal"]), doc())
    assert len(problems) == 1 and "--backend 'metal'" in problems[0] and "auto, cuda" in problems[0]
    problems = check_serve_argv(["serve", "/m", "--reasoning-effort=max"], doc())
    assert "'max'" in problems[0] and "reasoning_effort" in problems[0]


def test_flag_missing_its_value_and_switch_given_a_value():
    assert "--top-k expects a value" in check_serve_argv(argv(extra_serve_args=["--top-k"]), doc())[0]
    assert "is a switch" in check_serve_argv(["serve", "/m", "--thinking=1"], doc())[0]


def test_stray_positional():
    problems = check_serve_argv(argv(extra_serve_args=["stray"]), doc())
    assert problems and "stray" in problems[0]


def test_family_format_required():
    problems = check_serve_argv(argv(), doc(families={"nemotron_h": ["mlx-q4g64"]}))
    assert any("deepseek_v41" in p and "exl3-mul1" in p for p in problems)
    assert check_serve_argv(argv(), doc(families={"deepseek_v41": ["other"]}))


def test_defaults_the_image_lacks_point_at_the_setting():
    problems = check_serve_argv(argv(drafts=False), doc(drop=["--no-drafts"]))
    assert problems == ["--no-drafts is not served by this engine image (1.0.2): set drafts = true"]
    problems = check_serve_argv(argv(api_key=True), doc(drop=["--api-key-file"]))
    assert "set api_key = false" in problems[0]


def test_chat_template_only_when_listed():
    with_template = doc({"--chat-template": {}})
    a = rank0_argv(make_settings("head"), "/snap", with_template)
    assert "--chat-template" in a and check_serve_argv(a, with_template) == []
    assert "--chat-template" in check_serve_argv(a, doc())[0]


def test_empty_document():
    assert "capabilities" in check_serve_argv(argv(), {})[0]
    assert "capabilities" in check_serve_argv(argv(), None)[0]


def test_against_the_standin_engines_document():
    out = subprocess.run([sys.executable, str(STANDIN), "capabilities", "--json"], capture_output=True, text=True,
                         check=True).stdout
    caps = json.loads(out)
    s = make_settings("head", api_key=True, drafts=False, thinking=False, reasoning_effort="low",
                      extra_serve_args=["--temperature", "1.0", "--top-p", "0.95"])
    a = rank0_argv(s, "/snap", caps)
    assert "--chat-template" in a
    assert check_serve_argv(a, caps) == []
    assert check_serve_argv(a + ["--vision"], caps) == [
        "--vision is not served by this engine image (1.0.2-sparkfold-standin): remove --vision from extra_serve_args"]


def test_ported_settings_off_need_nothing():
    assert check_ported_settings(make_settings("head"), doc()) == []


def test_ported_settings_the_image_does_not_read_are_refused_with_the_fix():
    problems = check_ported_settings(make_settings("head", spill_gib=64, kv_shard=2), doc())
    assert problems == [
        "spill_gib = 64 asks for spill v2, but this engine image (1.0.2) does not read TF_SPILL_GIB (not in its "
        "capabilities env): set spill_gib = 0, or build an image whose engine carries the spill v2 patches and lists "
        "TF_SPILL_GIB",
        "kv_shard = 2 asks for KV sharding, but this engine image (1.0.2) does not read TF_DS_KV_SHARD (not in its "
        "capabilities env): set kv_shard = 0, or build an image whose engine carries the KV sharding patches and "
        "lists TF_DS_KV_SHARD",
    ]


def test_ported_settings_the_image_advertises_pass():
    caps = dict(doc(), env=["TENSORFOLD_API_KEY", "TF_SPILL_GIB", "TF_DS_KV_SHARD"])
    assert check_ported_settings(make_settings("head", spill_gib=64, kv_shard=2), caps) == []
    only_spill = dict(doc(), env=["TF_SPILL_GIB"])
    assert [p.split(" ")[0] for p in check_ported_settings(make_settings("head", spill_gib=64, kv_shard=2),
                                                             only_spill)] == ["kv_shard"]
    assert check_ported_settings(make_settings("head", spill_gib=64), None) == []  # check_serve_argv reports it


def test_the_standin_engine_reads_neither_ported_variable():
    out = subprocess.run([sys.executable, str(STANDIN), "capabilities", "--json"], capture_output=True, text=True,
                         check=True).stdout
    assert len(check_ported_settings(make_settings("head", spill_gib=8, kv_shard=2), json.loads(out))) == 2
