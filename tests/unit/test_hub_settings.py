"""What this machine gives the head's Hugging Face downloads, read and checked in operations/settings: the pinned
huggingface_hub, HF_ENDPOINT, the token (HF_TOKEN or the one `hf auth login` saved), huggingface_hub's variables
(timeouts, Xet, proxies) and the parallel files. Values that may be secret are never shown."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from settings_factory import ROOT, group_file, layers, load_one, make_settings

from operations import settings as S
from operations.settings import context, sources
from operations.settings.sources import Layers

PROXY = "http://user:s3cret@proxy.example:3128"


def load(environ=None, saved=None, role="head", **overrides):
    return S.load(layers(role, **overrides), environ or {}, "/home/nvidia", saved_token=saved)


def all_problems(environ=None, saved=None, **overrides):
    s, found = load(environ, saved, **overrides)
    return found + S.validate(s)


# ---- the pin ----

def test_the_pin_is_the_version_the_tests_install():
    pins = dict(line.split("==") for line in (ROOT / "tests" / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert group_file("all")["hf_hub_version"] == pins["huggingface_hub"]
    import huggingface_hub
    assert huggingface_hub.__version__ == make_settings().hf_hub_version  # what the unit tests run


@pytest.mark.parametrize("value", ["latest", ">=2.4", "2.4", "2.4.0\n", "2.4.0; id", ""])
def test_the_pin_is_one_exact_release(value):
    assert any("hf_hub_version" in p for p in all_problems(hf_hub_version=value)), value


def test_the_simulated_sparks_get_the_pinned_version():
    """tests/sim/build.sh installs the pin into the simulated Sparks' python3 (the sim's hf_python)."""
    build = (ROOT / "tests" / "sim" / "build.sh").read_text().splitlines()
    lines = [line for line in build if line.startswith(("ALL_PY=", "HF_VER=", "HF_REQ="))]
    out = subprocess.run(["bash", "-c", f"PY={sys.executable}; HERE=tests/sim; " + "; ".join(lines) +
                          '; echo "$HF_REQ"'], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"huggingface_hub=={group_file('all')['hf_hub_version']}"


# ---- HF_ENDPOINT ----

def test_hf_endpoint_is_read_from_huggingface_hubs_own_variable():
    assert make_settings(environ={"HF_ENDPOINT": "https://hf-mirror.example"}).hf_endpoint == "https://hf-mirror.example"
    both = {"HF_ENDPOINT": "https://a.example", "SPARKFOLD_HF_ENDPOINT": "https://b.example"}
    assert make_settings(environ=both).hf_endpoint == "https://b.example"  # sparkfold's own name wins
    # the environment beats the site file; an empty HF_ENDPOINT is unset, as huggingface_hub reads it
    base = layers("head")
    site = Layers(all=base.all, group=base.group, site={**base.site, "hf_endpoint": "https://c.example"}, override={})
    assert S.load(site, {"HF_ENDPOINT": ""}, "/h")[0].hf_endpoint == "https://c.example"
    assert S.load(site, {"HF_ENDPOINT": "https://d.example"}, "/h")[0].hf_endpoint == "https://d.example"
    assert S.env_names("hf_endpoint") == ("HF_ENDPOINT", "SPARKFOLD_HF_ENDPOINT")


def test_a_bad_hf_endpoint_names_the_variable():
    found = all_problems({"HF_ENDPOINT": "ftp://x"})
    assert any(p.startswith("hf_endpoint = 'ftp://x' must be") for p in found), found


# ---- the token ----

def test_hf_token_wins_over_the_saved_token():
    s, found = load({"HF_TOKEN": "hf_env"}, saved=lambda: "hf_saved")
    assert (s.hf_token, s.hf_token_source, found) == ("hf_env", "HF_TOKEN", [])
    s, _ = load({"HUGGING_FACE_HUB_TOKEN": "hf_old"}, saved=lambda: "hf_saved")
    assert (s.hf_token, s.hf_token_source) == ("hf_old", "HUGGING_FACE_HUB_TOKEN")


def test_the_token_hf_auth_login_saved_is_used_without_hf_token():
    s, found = load({"HF_TOKEN": ""}, saved=lambda: "hf_saved\n")
    assert (s.hf_token, s.hf_token_source, found) == ("hf_saved", sources.SAVED_TOKEN, [])
    assert S.validate(load({}, saved=lambda: "hf_saved", ablit=True)[0]) == []  # ablit is satisfied by it
    s, _ = load({}, saved=lambda: None)
    assert (s.hf_token, s.hf_token_source) == ("", "")
    assert "hf_saved" not in repr(load({}, saved=lambda: "hf_saved")[0])


def test_a_failing_token_lookup_is_a_problem_naming_the_fix():
    def broken():
        raise RuntimeError("OIDC exchange failed for hf_leaked")

    s, found = load({}, saved=broken)
    assert s.hf_token == "" and len(found) == 1 and "hf auth login" in found[0] and "hf_leaked" not in found[0]


def test_saved_hf_token_asks_huggingface_hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    token_file = tmp_path / "token"
    token_file.write_text("hf_from_login\n")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "stored_tokens"))
    assert sources.saved_hf_token() == "hf_from_login"


def test_the_saved_token_is_asked_once_per_process_and_again_when_what_it_reads_changes(monkeypatch, tmp_path):
    """A run loads the settings up to six times; huggingface_hub's get_token() (a file, maybe a token exchange) is
    asked once, and again for another token file or other variables. A lookup that fails is not kept."""
    import huggingface_hub
    from huggingface_hub import constants

    asked = []
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: asked.append(constants.HF_TOKEN_PATH) or "hf_saved")
    for name in ("HF_OIDC_RESOURCE", "HF_OIDC_ID_TOKEN", *sources.TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    for role in ("head", "worker", "head", "worker", "head", "worker"):
        s, found = load({}, saved=sources.saved_hf_token, role=role)
        assert (s.hf_token, s.hf_token_source, found) == ("hf_saved", sources.SAVED_TOKEN, [])
    assert asked == [str(tmp_path / "token")]
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "other"))
    assert sources.saved_hf_token() == "hf_saved" and len(asked) == 2
    monkeypatch.setenv("HF_OIDC_RESOURCE", "models/me/m")
    assert sources.saved_hf_token() == "hf_saved" and sources.saved_hf_token() == "hf_saved" and len(asked) == 3
    sources.forget_local_reads()
    assert sources.saved_hf_token() == "hf_saved" and len(asked) == 4

    def broken():
        asked.append("broken")
        raise RuntimeError("OIDC exchange failed")

    monkeypatch.setattr(huggingface_hub, "get_token", broken)
    monkeypatch.setenv("HF_OIDC_RESOURCE", "models/me/other")
    for _ in range(2):
        assert "hf auth login" in load({}, saved=sources.saved_hf_token)[1][0]
    assert asked[-2:] == ["broken", "broken"]


def test_a_real_run_reads_the_saved_token(monkeypatch):
    """context._load, the one place a run reads settings, passes huggingface_hub's lookup."""
    seen = {}

    def fake_load(layers_, environ, home, saved_token=None):
        seen["saved"] = saved_token
        return make_settings(), []

    class Spark:
        name, connected, data = "h", False, {"ssh_user": "nvidia"}

    monkeypatch.setattr(context, "load", fake_load)
    monkeypatch.setattr(context, "layers_of", lambda spark: None)
    monkeypatch.setattr(context, "send_without_delay", lambda spark: None)
    monkeypatch.setattr(context, "_loaded", {})
    context._load(Spark())
    assert seen["saved"] is sources.saved_hf_token


def test_a_bad_token_is_refused_naming_its_source_not_the_token():
    found = all_problems(saved=lambda: "hf_a\x01b")
    assert any(p.startswith(f"{sources.SAVED_TOKEN} (the token, not shown)") for p in found), found
    assert not any("hf_a" in p for p in found)


# ---- huggingface_hub's variables ----

def test_the_hub_variables_are_taken_from_the_environment():
    environ = {"HF_HUB_DOWNLOAD_TIMEOUT": "60", "HF_HUB_ETAG_TIMEOUT": "20", "HF_XET_HIGH_PERFORMANCE": "1",
               "HTTPS_PROXY": PROXY, "no_proxy": "127.0.0.1,localhost", "http_proxy": "", "PATH": "/bin",
               "HF_HOME": "/x"}
    s = make_settings(environ=environ)
    assert s.hf_env == {"HF_HUB_DOWNLOAD_TIMEOUT": "60", "HF_HUB_ETAG_TIMEOUT": "20", "HF_XET_HIGH_PERFORMANCE": "1",
                        "HTTPS_PROXY": PROXY, "no_proxy": "127.0.0.1,localhost"}
    assert S.validate(s) == [] and "s3cret" not in repr(s)
    assert make_settings().hf_env == {}


@pytest.mark.parametrize("environ, fragment", [
    ({"HF_HUB_DOWNLOAD_TIMEOUT": "10s"}, "HF_HUB_DOWNLOAD_TIMEOUT = '10s' must be a whole number of seconds"),
    ({"HF_HUB_ETAG_TIMEOUT": "0"}, "HF_HUB_ETAG_TIMEOUT = '0' must be a whole number of seconds"),
    ({"HF_XET_HIGH_PERFORMANCE": "fast"}, "HF_XET_HIGH_PERFORMANCE = 'fast' must be 1 or 0"),
    ({"HTTPS_PROXY": PROXY + "\n"}, "HTTPS_PROXY (value not shown) must be one line"),
])
def test_a_hub_variable_huggingface_hub_would_ignore_is_refused(environ, fragment):
    found = S.validate(make_settings(environ=environ))
    assert any(fragment in p for p in found), found
    assert not any("s3cret" in p for p in found)


@pytest.mark.parametrize("value, ok", [(1, True), (8, True), (64, True), (0, False), (65, False)])
def test_max_workers_is_a_sane_count(value, ok):
    assert (not any("hf_max_workers" in p for p in all_problems(hf_max_workers=value))) == ok


def test_no_secret_reaches_a_settings_message():
    """Every problem the pair's settings can produce here: none shows the proxy's password or a token."""
    found = all_problems({"HTTPS_PROXY": PROXY + "\x00", "HF_TOKEN": "hf_tok\n", "HF_HUB_DOWNLOAD_TIMEOUT": "x"},
                         api_key=True, api_key_file="/nonexistent/key")
    assert found and not any(re.search(r"s3cret|hf_tok", p) for p in found), found


def test_the_settings_listing_names_hf_endpoint_and_the_pin():
    rows = {name: sources.env_names(name) for name in S.SETTING_NAMES}
    assert rows["hf_hub_version"] == ("SPARKFOLD_HF_HUB_VERSION",) and "HF_ENDPOINT" in rows["hf_endpoint"]
    assert load_one("head", {"SPARKFOLD_HF_HUB_VERSION": "2.5.0"})[0].hf_hub_version == "2.5.0"


def test_deploys_onto_the_simulated_pair_drop_this_machines_hub_variables_and_token(monkeypatch):
    """tests/sim/sim.py deploy_env: the fake hub on the simulated head's loopback must be reached directly, and this
    machine's token must not travel into a simulated Spark; the list covers everything the settings read."""
    from tests.sim import sim

    read = set(sources.HUB_ENV) | set(sources.TOKEN_ENV) | set(sources.TOOL_ENV.values())
    assert read <= set(sim.HUB_VARIABLES)
    for name in sim.HUB_VARIABLES:
        monkeypatch.setenv(name, "http://user:s3cret@proxy:3128")
    env = sim.deploy_env({"HF_TOKEN": "hf_simtoken"})
    assert not read & set(env) - {"HF_TOKEN"} and env["HF_TOKEN"] == "hf_simtoken"
    assert env["HF_TOKEN_PATH"].endswith("no-hf-token") and env["SPARKFOLD_SITE"] == str(sim.SITE_FILE)
    s, found = load(env, saved=sources.saved_hf_token)
    assert s.hf_env == {} and s.hf_endpoint == "" and s.hf_token == "hf_simtoken" and found == []


@pytest.mark.parametrize("environ, name", [({"HF_HUB_DOWNLOAD_TIMEOUT": "abc"}, "HF_HUB_DOWNLOAD_TIMEOUT"),
                                           ({"HF_HUB_ETAG_TIMEOUT": "1.5"}, "HF_HUB_ETAG_TIMEOUT"),
                                           ({"HF_HUB_ETAG_TIMEOUT": ""}, "HF_HUB_ETAG_TIMEOUT")])
def test_a_timeout_huggingface_hub_cannot_start_with_is_the_one_problem(environ, name):
    """huggingface_hub int()s its timeouts as it is imported, so asking it for the saved token would fail with a
    ValueError that reads as a token problem: the token is not asked, and only the variable is named."""
    asked = []

    def saved():
        asked.append(1)
        raise ValueError("invalid literal for int()")

    s, found = load(environ, saved=saved, ablit=True)
    problems = found + S.validate(s)
    assert asked == [] and [p for p in problems if name in p or "token" in p.lower()] == [
        f"{name} = {environ[name]!r} must be a whole number of seconds from 1 to 86400: huggingface_hub cannot even "
        "start with it (on this machine, which then cannot read your saved token, nor on the head)"], problems
