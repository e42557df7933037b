"""The head's Hugging Face tools, derived from Settings (paths come from operations/layout.py)."""

from __future__ import annotations


def hub_python(s) -> str:
    """The python that runs the download and plan scripts: hf_python, or the venv the deploy makes."""
    return s.hf_python or f"{s.layout.venv}/bin/python"


def checkpoint_plan_args(s) -> dict:
    """The HfPlan fact arguments of the active checkpoint."""
    return {"python": hub_python(s), "repo": s.active_model_repo, "revision": s.active_model_revision,
            "cache_dir": s.layout.hub, "local_dir": "", "include": (), "token_path": s.layout.hf_token,
            "endpoint": s.hf_endpoint}
