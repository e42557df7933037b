"""Facts about what the ranks load: Hugging Face downloads, data folders, weight files, free space, a peer's copy.

All exit 0 and stay cheap: they stat and list, and hash only small files (a MANIFEST, a SHA256SUMS).
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api import FactBase

from operations.remote import heredoc_command

_RANK_FILE = re.compile(r"^(?:rank(\d)of2-[0-9a-f]+\.bin|\.rank(\d)of2\.partial)$")
_LISTING = "-type f -printf '%P\\t%s\\t%T@\\n'"  # path, size, mtime: what rsync -a keeps


def _parse_listing_line(line: str, files: dict) -> None:
    parts = line.split("\t")
    if len(parts) == 3 and parts[1].isdigit():
        files[parts[0]] = [int(parts[1]), int(float(parts[2]))]


class HfPlan(FactBase):
    """hf_plan.py's JSON for one repo/revision in a cache (cache_dir = <hf_cache>/hub) or a local_dir.

    Runs with `python` when it exists, else python3 (the planner needs only the standard library, so --dry works
    before the deploy has made the huggingface_hub venv). `token_path` is a file holding the token, never the token.
    """

    @staticmethod
    def default():
        return {"complete": False, "missing": [], "missing_bytes": None, "commit": None, "total_bytes": None,
                "offline": True, "model_type": None, "manifest": False, "error": "no answer from the planner"}

    def command(self, python, repo, revision, cache_dir="", local_dir="", include=(), token_path="", endpoint=""):
        args = ["--repo", repo, "--revision", revision]
        args += ["--cache-dir", cache_dir] if cache_dir else ["--local-dir", local_dir]
        for pattern in include or ():
            args += ["--include", pattern]
        env = []
        if endpoint:
            env.append(f"HF_ENDPOINT={shlex.quote(endpoint)}")
        if token_path:
            env.append(f"HF_TOKEN_PATH={shlex.quote(token_path)}")
        head = (f"PY={shlex.quote(python)}; command -v \"$PY\" >/dev/null 2>&1 || PY=python3; "
                f"{' '.join(env)} \"$PY\" - {' '.join(shlex.quote(a) for a in args)}")
        return heredoc_command(head, "hf_plan", "2>/dev/null || true")

    def process(self, output):
        for line in reversed(output):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    break
        return self.default()


class DirFiles(FactBase):
    """{relative path: [size, mtime seconds]} of the regular files under a folder ({} when it is absent)."""

    default = dict

    def command(self, path):
        return f"find -H {shlex.quote(path)} {_LISTING} 2>/dev/null || true"

    def process(self, output):
        files = {}
        for line in output:
            _parse_listing_line(line, files)
        return files


class FolderCheck(FactBase):
    """A folder verified against a sha256sum-format list: its files, the list's own sha256 and its entry names, and
    the content of a marker file. None when the folder is absent. Hashes only the (small) list itself."""

    @staticmethod
    def default():
        return None

    def command(self, path, sums, marker):
        q = shlex.quote
        return (f"cd {q(path)} 2>/dev/null || exit 0; echo '#DIR'; "
                f"echo \"#SUMS $(sha256sum {q(sums)} 2>/dev/null | cut -c1-64)\"; "
                f"echo \"#MARKER $(head -c 200 {q(marker)} 2>/dev/null)\"; "
                f"sed -n 's/^[0-9a-f]\\{{64\\}} [ *]/#NAME /p' {q(sums)} 2>/dev/null; "
                f"find -H . {_LISTING} 2>/dev/null || true")

    def process(self, output):
        out = {"files": {}, "sums_sha": None, "names": [], "marker": None}
        if "#DIR" not in output:
            return None
        for line in output:
            if line.startswith("#SUMS "):
                out["sums_sha"] = line[6:].strip() or None
            elif line.startswith("#MARKER "):
                out["marker"] = line[8:].strip() or None
            elif line.startswith("#NAME "):
                out["names"].append(line[6:].removeprefix("./"))
            elif not line.startswith("#"):
                _parse_listing_line(line, out["files"])
        return out


class RankFolder(FactBase):
    """A weight-file folder: {"bins": {rank: [rank<R>of2-*.bin]}, "partial": [ranks with .rank<R>of2.partial],
    "source": the .sparkfold-source sidecar or None}."""

    @staticmethod
    def default():
        return {"bins": {}, "partial": [], "source": None}

    def command(self, path):
        q = shlex.quote(path)
        return (f"ls -A {q} 2>/dev/null | sed 's/^/#F /'; "
                f"echo \"#SOURCE $(cat {q}/.sparkfold-source 2>/dev/null)\"")

    def process(self, output):
        out = self.default()
        for line in output:
            if line.startswith("#SOURCE "):
                out["source"] = line[8:].strip() or None
                continue
            m = _RANK_FILE.match(line[3:]) if line.startswith("#F ") else None
            if m and m.group(1) is not None:
                out["bins"].setdefault(int(m.group(1)), []).append(line[3:])
            elif m:
                out["partial"].append(int(m.group(2)))
        return out


class FileText(FactBase):
    """A small file's first line (a sidecar, a ref), or None."""

    @staticmethod
    def default():
        return None

    def command(self, path):
        return f"head -n1 {shlex.quote(path)} 2>/dev/null | sed 's/^/#T /' || true"

    def process(self, output):
        for line in output:
            if line.startswith("#T "):
                return line[3:].strip()
        return None


class LinkTarget(FactBase):
    """What a symlink points to (readlink), or None."""

    @staticmethod
    def default():
        return None

    def command(self, path):
        return f"readlink {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return output[0].strip() if output else None


class HfHubPython(FactBase):
    """huggingface_hub's version as seen by a python: "1.2.3", "" when it does not import, None when no python."""

    @staticmethod
    def default():
        return None

    def command(self, python):
        q = shlex.quote(python)
        return (f"if command -v {q} >/dev/null 2>&1; then "
                f"{q} -c 'import huggingface_hub as h; print(\"#HUB \" + h.__version__)' 2>/dev/null "
                f"|| echo '#HUB '; else echo '#NOPY'; fi")

    def process(self, output):
        for line in output:
            if line.startswith("#HUB"):
                return line[4:].strip()
        return None


def _free_script(path: str) -> str:
    # df of the nearest folder that exists: what will be written lands on that file system
    return (f"p={shlex.quote(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
            "echo \"#FREE $(df -PB1 \"$p\" | awk 'NR==2{print $4}')\"")


class FreeBytes(FactBase):
    """Bytes free on the file system that holds (or will hold) a path."""

    @staticmethod
    def default():
        return None

    def command(self, path):
        return _free_script(path) + " 2>/dev/null || true"

    def process(self, output):
        for line in output:
            if line.startswith("#FREE ") and line[6:].strip().isdigit():
                return int(line[6:])
        return None


class PeerFolder(FactBase):
    """Run on the head: the worker's copy of a folder, over ssh on the link.

    {"reachable": bool, "files": {path: [size, mtime]}, "free": bytes free where it lives, "link": readlink of
    `link` or None}. Unreachable (link not
    up yet, during --dry on a fresh pair) is an answer, not a failure.
    """

    @staticmethod
    def default():
        return {"reachable": False, "files": {}, "free": None, "link": None}

    def command(self, target, path, link=""):
        remote = f"find -H {shlex.quote(path)} {_LISTING} 2>/dev/null; {_free_script(path)}; "
        if link:
            remote += f"echo \"#LINK $(readlink {shlex.quote(link)})\"; "
        remote += "echo '#OK'"
        return (f"ssh -o BatchMode=yes -o ConnectTimeout=5 {shlex.quote(target)} {shlex.quote(remote)} "
                "2>/dev/null || true")

    def process(self, output):
        out = self.default()
        out["reachable"] = "#OK" in output
        for line in output:
            if line.startswith("#FREE ") and line[6:].strip().isdigit():
                out["free"] = int(line[6:])
            elif line.startswith("#LINK "):
                out["link"] = line[6:].strip() or None
            elif not line.startswith("#"):
                _parse_listing_line(line, out["files"])
        return out


class AblitShards(FactBase):
    """{shard file: size} of the pack's shards that hold layers 10-35's attn.wo_b (what the overlay rewrites)."""

    default = dict

    def command(self, snapshot):
        code = ("import json,os,re,sys;d=sys.argv[1];"
                "m=json.load(open(os.path.join(d,'model.safetensors.index.json')))['weight_map'];"
                "r=re.compile(r'layers\\.(1[0-9]|2[0-9]|3[0-5])\\.attn\\.wo_b');"
                "[print('#S',f,os.stat(os.path.join(d,f)).st_size) for f in sorted({v for k,v in m.items() "
                "if r.search(k)})]")
        return f"python3 -c {shlex.quote(code)} {shlex.quote(snapshot)} 2>/dev/null || true"

    def process(self, output):
        out = {}
        for line in output:
            parts = line.split(" ")
            if len(parts) == 3 and parts[0] == "#S" and parts[2].isdigit():
                out[parts[1]] = int(parts[2])
        return out
