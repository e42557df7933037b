"""Facts about the model data the ranks load: a Hugging Face download's plan, the huggingface_hub a python sees, the
ABLIT pack's shards, and a rank's weight-file folder. Every command exits 0; nothing large is read or hashed."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from typing import TypedDict

from pyinfra.api import FactBase

from operations.remote import heredoc_command
from operations.util.commands import source_env_file
from operations.util.fact_reuse import fact_once, keep, kept

_RANK_FILE = re.compile(r"^(?:rank(\d)of2-[0-9a-f]+\.bin|\.rank(\d)of2\.partial)$")


class HfPlanDict(TypedDict, total=False):
    complete: bool  # every wanted file is in place
    missing: list[list]  # [[path, size]] still to fetch
    missing_bytes: int | None  # what a download still transfers
    commit: str | None
    total_bytes: int | None
    offline: bool  # answered from the local manifest, without the Hub
    model_type: str | None  # config.json's model_type
    manifest: bool  # hf_fetch's .sparkfold-complete.json covers the request
    error: str | None


def plan_words(repo: str, revision: str, cache_dir: str = "", local_dir: str = "", include: tuple[str, ...] = (),
               max_workers: int = 8) -> list[str]:
    """hf_plan.py's arguments for one download: HfPlan's, and each request of HfPlansOffline."""
    words = ["--repo", repo, "--revision", revision, "--max-workers", str(max_workers)]
    words += ["--cache-dir", cache_dir] if cache_dir else ["--local-dir", local_dir]
    for pattern in include or ():
        words += ["--include", pattern]
    return words


class HfPlan(FactBase[HfPlanDict]):
    """hf_plan.py's answer for one repo/revision in a cache (cache_dir = <hf_cache>/hub) or a local_dir: what is
    still to download, and the commit the revision names (huggingface_hub's dry run; offline for a complete one).

    Runs with `python` when it exists, else python3 (the offline answer needs only the standard library, and without
    huggingface_hub the answer says the size is unknown: --dry works before the deploy has made the venv).
    `token_path` is a file holding the token, never the token; `env_file` (sourced when present) holds
    huggingface_hub's variables from this machine, never shown on a command line.
    """

    @staticmethod
    def default() -> HfPlanDict:
        return {"complete": False, "missing": [], "missing_bytes": None, "commit": None, "total_bytes": None,
                "offline": True, "model_type": None, "manifest": False, "error": "no answer from the planner"}

    def command(self, python: str, repo: str, revision: str, cache_dir: str = "", local_dir: str = "",
                include: tuple[str, ...] = (), token_path: str = "", endpoint: str = "", env_file: str = "",
                max_workers: int = 8) -> str:
        args = plan_words(repo, revision, cache_dir, local_dir, include, max_workers)
        env = []
        if endpoint:
            env.append(f"HF_ENDPOINT={shlex.quote(endpoint)}")
        if token_path:
            env.append(f"HF_TOKEN_PATH={shlex.quote(token_path)}")
        head = (f"{source_env_file(env_file)}PY={shlex.quote(python)}; command -v \"$PY\" >/dev/null 2>&1 || "
                f"PY=python3; {' '.join(env)} \"$PY\" - {' '.join(shlex.quote(a) for a in args)}")
        return heredoc_command(head, "hf_plan", "2>/dev/null || true")

    def process(self, output: list[str]) -> HfPlanDict:
        for line in reversed(output):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    break
        return self.default()


def _settled(plan: Mapping[str, object]) -> bool:
    return bool(plan.get("complete") and plan.get("manifest"))


def hf_plan(spark, **args) -> HfPlanDict:
    """HfPlan on the host `spark`, read once per run once the download is complete (its manifest written): the
    checkpoint's plan is asked by several operations, and a complete download stays complete for the rest of the
    run."""
    return fact_once(spark, HfPlan, _settled, **args)


class HfPlansOffline(FactBase[list]):
    """hf_plan.py's offline answers for several downloads in one python (standard library only, no Hub): per
    request, in order, the answer for a complete manifest-covered download, None for one that needs the Hub.
    `requests`: a tuple of plan_words tuples. [] when the answer is not whole."""

    @staticmethod
    def default() -> list:
        return []

    def command(self, requests: tuple) -> str:
        body = json.dumps([list(words) for words in requests])
        return heredoc_command(f"python3 - --offline {shlex.quote(body)}", "hf_plan", "2>/dev/null || true")

    def process(self, output: list[str]) -> list:
        try:
            return [json.loads(line) for line in output if line.strip()]
        except ValueError:
            return []


def hf_plans_kept(spark, requests: list[dict]) -> None:
    """Every complete download among `requests` (hf_plan's arguments) read in one round trip and kept for
    hf_plan: a converged run asks one python for all its downloads' plans, not one each. One that is not complete
    is left to hf_plan (which asks the Hub), so a first run pays one short offline read more."""
    wanted = [args for args in requests if not kept(spark, HfPlan, **args)]
    if not wanted:
        return
    words = tuple(tuple(plan_words(args["repo"], args["revision"], args["cache_dir"], args["local_dir"],
                                   args["include"], args["max_workers"])) for args in wanted)
    answers = spark.get_fact(HfPlansOffline, requests=words)
    if len(answers) != len(wanted):
        return
    for args, answer in zip(wanted, answers, strict=True):
        if isinstance(answer, dict) and _settled(answer):
            keep(spark, HfPlan, answer, **args)


class HubPythonDict(TypedDict):
    hub: str  # huggingface_hub's version, "" when it does not import
    xet: str  # hf_xet's version (huggingface_hub's Xet transfers), "" when it does not import


# prints '#HUB <version>' and '#XET <version>', each empty when the module does not import
_VERSIONS = ("import importlib.metadata as m\n"
             "def v(module, dist):\n"
             "    try:\n"
             "        __import__(module)\n"
             "        return m.version(dist)\n"
             "    except Exception:\n"
             "        return ''\n"
             "print('#HUB ' + v('huggingface_hub', 'huggingface_hub'))\n"
             "print('#XET ' + v('hf_xet', 'hf-xet'))\n")


class HfHubPython(FactBase[HubPythonDict | None]):
    """The huggingface_hub and hf_xet versions `python` imports ("" for one it cannot import), None when there is
    no such python (pyinfra's requires_command then gives the default)."""

    def requires_command(self, python: str) -> str:
        return shlex.quote(python)

    def command(self, python: str) -> str:
        return f"{shlex.quote(python)} -c {shlex.quote(_VERSIONS)} 2>/dev/null || echo '#HUB '"

    def process(self, output: list[str]) -> HubPythonDict | None:
        found = {line[:4]: line[4:].strip() for line in output if line.startswith(("#HUB", "#XET"))}
        if "#HUB" not in found:
            return None
        return {"hub": found["#HUB"], "xet": found.get("#XET", "")}


class AblitShards(FactBase[dict[str, int]]):
    """{shard file: size} of the pack's shards that hold layers 10-35's attn.wo_b (what the overlay rewrites): the
    space an ABLIT pack needs."""

    default = dict

    def requires_command(self, snapshot: str) -> str:
        return "python3"

    def command(self, snapshot: str) -> str:
        code = ("import json,os,re,sys;d=sys.argv[1];"
                "m=json.load(open(os.path.join(d,'model.safetensors.index.json')))['weight_map'];"
                "r=re.compile(r'layers\\.(1[0-9]|2[0-9]|3[0-5])\\.attn\\.wo_b');"
                "[print('#S',f,os.stat(os.path.join(d,f)).st_size) for f in sorted({v for k,v in m.items() "
                "if r.search(k)})]")
        return f"python3 -c {shlex.quote(code)} {shlex.quote(snapshot)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, int]:
        out = {}
        for line in output:
            parts = line.split(" ")
            if len(parts) == 3 and parts[0] == "#S" and parts[2].isdigit():
                out[parts[1]] = int(parts[2])
        return out


class RankFolderDict(TypedDict):
    bins: dict[int, list[str]]  # rank -> its rank<R>of2-<hash>.bin files
    partial: list[int]  # ranks with an interrupted .rank<R>of2.partial
    source: str | None  # the .sparkfold-source sidecar: what the files were built from


class RankFolder(FactBase[RankFolderDict]):
    """A weight-file folder's rank files, interrupted builds and source sidecar: whether a rank's file is current."""

    @staticmethod
    def default() -> RankFolderDict:
        return {"bins": {}, "partial": [], "source": None}

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (f"ls -A {quoted} 2>/dev/null | sed 's/^/#F /'; "
                f"echo \"#SOURCE $(cat {quoted}/.sparkfold-source 2>/dev/null)\"")

    def process(self, output: list[str]) -> RankFolderDict:
        out = self.default()
        for line in output:
            if line.startswith("#SOURCE "):
                out["source"] = line[8:].strip() or None
                continue
            match = _RANK_FILE.match(line[3:]) if line.startswith("#F ") else None
            if match and match.group(1) is not None:
                out["bins"].setdefault(int(match.group(1)), []).append(line[3:])
            elif match:
                out["partial"].append(int(match.group(2)))
        return out
