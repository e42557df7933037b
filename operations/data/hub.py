"""The head's Hugging Face tools, derived from Settings (paths come from operations/layout.py)."""

from __future__ import annotations

import shlex

from operations.facts.model import HubPythonDict


def hub_python(s) -> str:
    """The python that runs the download and plan scripts: hf_python, or the venv the deploy makes."""
    return s.hf_python or f"{s.layout.venv}/bin/python"


def plan_args(s, repo: str, revision: str, cache_dir: str = "", local_dir: str = "", include=()) -> dict:
    """The HfPlan fact arguments of one download (the same for every operation that asks, so it is read once)."""
    return {"python": hub_python(s), "repo": repo, "revision": revision, "cache_dir": cache_dir,
            "local_dir": local_dir, "include": tuple(include), "token_path": s.layout.hf_token,
            "endpoint": s.hf_endpoint, "env_file": s.layout.hf_env, "max_workers": s.hf_max_workers}


def checkpoint_plan_args(s) -> dict:
    """The HfPlan fact arguments of the active checkpoint."""
    return plan_args(s, s.active_model_repo, s.active_model_revision, cache_dir=s.layout.hub)


def hub_env_text(env: dict[str, str]) -> str:
    """The hf-env file: one `export NAME='value'` line per variable, in name order ("" without any)."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in sorted(env.items()))


def hub_env_name(env: dict[str, str]) -> str:
    """The plan's line for the hf-env file: the variables' names, never their values (a proxy may hold a
    password)."""
    if not env:
        return "huggingface_hub variables for the head's downloads: none set on this machine"
    return f"huggingface_hub variables for the head's downloads (0600 file): {', '.join(sorted(env))}"


def token_name(source: str) -> str:
    """The plan's line for the token file: where the token came from, never the token."""
    if not source:
        return "Hugging Face token for the head's downloads: none (anonymous access)"
    return f"Hugging Face token for the head's downloads (0600 file): from {source}"


def hub_versions(have: HubPythonDict | None) -> tuple[str, str]:
    """(huggingface_hub's version, hf_xet's) in an HfHubPython answer, "" for each one missing."""
    return (have["hub"], have["xet"]) if have else ("", "")


def hub_current(have: HubPythonDict | None, version: str, venv: str) -> bool:
    """The python has exactly `version`, and hf_xet where the venv is the deploy's own (a user's python is only
    checked for the version)."""
    hub, xet = hub_versions(have)
    return hub == version and bool(xet or not venv)


def hub_change(have: HubPythonDict | None, version: str, venv: str) -> str:
    """The plan's line for the head's huggingface_hub: what the python has, and what it will have.

    venv: the deploy's own venv ("" when hf_python names the user's python, which is checked, never changed)."""
    hub, xet = hub_versions(have)
    if have is None and venv:
        return f"huggingface_hub {version} on the head (a new venv, {venv})"
    if hub_current(have, version, venv):
        return f"huggingface_hub {version} on the head" + (f" (hf_xet {xet})" if xet else " (no hf_xet)")
    if not venv:
        return f"huggingface_hub {hub or 'none'} on the head (hf_python), hf_hub_version is {version}"
    if hub == version:
        return f"huggingface_hub {version} on the head: hf_xet added"
    return f"huggingface_hub {hub or 'none'} → {version} on the head"
