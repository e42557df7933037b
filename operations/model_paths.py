"""Where the model data lives on each Spark, derived from Settings (shared by model_data, weights and ablit)."""

from __future__ import annotations

from operations.hf_cache import repo_folder_name

SERVED_LINK = "sparkfold-current"  # <repo folder>/sparkfold-current -> snapshots/<commit>: the served snapshot
CONTAINER_HF = "/root/.cache/huggingface"  # where the launch step mounts the Hugging Face cache


def paths(s) -> dict:
    """Every location the model-data steps write on this Spark."""
    hub = f"{s.hf_cache}/hub"
    d = s.data_dir
    return {
        "hub": hub,
        "repo": f"{hub}/{repo_folder_name(s.active_model_repo)}",
        "engram": f"{d}/engram",
        "kit_src": f"{d}/kit-src",
        "kit": f"{d}/kit",
        "token_map": f"{d}/token-map",
        "rank_cache": f"{d}/rank-cache",
        "ablit": f"{d}/ablit",
        "overlay": f"{d}/ablit-overlay",
        "venv": f"{s.state_dir}/venv",
        "token_file": f"{s.state_dir}/hf-token",
    }


def worker_paths(s) -> dict:
    """The worker's paths as the head sees them: from peer_data_dir/peer_hf_cache when settings provide them, else
    the head's own (the same user and home on both Sparks)."""
    data_dir = getattr(s, "peer_data_dir", "") or s.data_dir
    hf_cache = getattr(s, "peer_hf_cache", "") or s.hf_cache
    return {"engram": f"{data_dir}/engram", "kit": f"{data_dir}/kit", "token_map": f"{data_dir}/token-map",
            "rank_cache": f"{data_dir}/rank-cache", "repo": f"{hf_cache}/hub/{repo_folder_name(s.active_model_repo)}"}


def hub_python(s) -> str:
    return s.hf_python or f"{paths(s)['venv']}/bin/python"


def checkpoint_plan_args(s) -> dict:
    """The HfPlan fact arguments of the active checkpoint."""
    p = paths(s)
    return {"python": hub_python(s), "repo": s.active_model_repo, "revision": s.active_model_revision,
            "cache_dir": p["hub"], "local_dir": "", "include": (), "token_path": p["token_file"],
            "endpoint": s.hf_endpoint}


def active_rank_link(s, rank: int) -> str:
    """The folder the launch step mounts as /rank-cache for this rank (a link to the current source's folder)."""
    return f"{s.data_dir}/rank-cache/active-rank{rank}"
