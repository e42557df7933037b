"""Rank 0's sampling defaults (operations/rank/sampling.py): the flags passed, the plan's line and its warnings,
and what a running rank 0 serves, read from its argv."""

from __future__ import annotations

from rank_inputs import CAPS
from settings_factory import make_settings

from operations.rank.sampling import sampling_args, sampling_line, sampling_plan, served_sampling

NO_TOP_K = {"version": "old-engine", "serve": {"flags": {"--temperature": {}, "--top-p": {}}}}


def test_the_stand_in_engine_serves_the_real_flag_names():
    flags = CAPS["serve"]["flags"]
    assert {"--temperature", "--top-p", "--top-k"} <= set(flags)


def test_the_recipes_defaults_are_passed_and_shown():
    s = make_settings("head")
    assert (s.temperature, s.top_p, s.top_k) == ("1.0", "0.95", "20")
    assert sampling_args(s, CAPS) == ["--temperature", "1.0", "--top-p", "0.95", "--top-k", "20"]
    assert sampling_plan(s, CAPS) == ("sampling: temperature 1.0, top_p 0.95, top_k 20", [])


def test_empty_settings_leave_the_engines_defaults():
    s = make_settings("head", temperature="", top_p="", top_k="")
    assert sampling_args(s, CAPS) == []
    line, warnings = sampling_plan(s, CAPS)
    assert line.startswith("sampling: engine default") and warnings == []
    partly = make_settings("head", top_p="")
    assert sampling_plan(partly, CAPS)[0] == "sampling: temperature 1.0, top_p engine default, top_k 20"


def test_a_flag_the_image_lacks_is_not_passed_and_is_warned_about_by_setting_name():
    s = make_settings("head")
    assert sampling_args(s, NO_TOP_K) == ["--temperature", "1.0", "--top-p", "0.95"]
    line, warnings = sampling_plan(s, NO_TOP_K)
    assert line == "sampling: temperature 1.0, top_p 0.95, top_k engine default"
    assert len(warnings) == 1 and warnings[0].startswith("top_k = 20 is not served")
    assert "(old-engine) does not list --top-k" in warnings[0] and 'set top_k = ""' in warnings[0]
    # top_k = "" asks for the engine's default: nothing to warn about
    assert sampling_plan(make_settings("head", top_k=""), NO_TOP_K)[1] == []


def test_unknown_capabilities_say_what_will_be_asked_for_without_a_warning():
    line, warnings = sampling_plan(make_settings("head"), None)
    assert line.startswith("sampling: temperature 1.0, top_p 0.95, top_k 20 (each passed once") and warnings == []


def test_served_sampling_reads_rank_0s_argv():
    argv = ["tensorfold-native", "serve", "/m", "--max-tokens", "9", "--temperature", "0.6", "--top-k=40"]
    assert served_sampling(argv) == {"temperature": "0.6", "top_p": "", "top_k": "40"}
    assert sampling_line(served_sampling(argv)) == "sampling: temperature 0.6, top_p engine default, top_k 40"
    assert served_sampling(["tensorfold-native", "serve", "/m"]) == {"temperature": "", "top_p": "", "top_k": ""}
