#!/usr/bin/env python3
"""A small fake Hugging Face endpoint for the simulated pair (no internet there).

Serves the repositories built by repos.py with the routes and headers huggingface_hub 2.x needs
(HF_ENDPOINT=http://127.0.0.1:5555):

  GET  /api/models/<repo>[/revision/<rev>][?blobs=true]   model_info / repo_info
  GET  /api/models/<repo>/tree/<rev>[/<path>][?recursive=true]   list_repo_tree (snapshot_download)
  POST /api/models/<repo>/paths-info/<rev>                get_paths_info
  GET  /api/models/<repo>/refs | /commits/<rev> | /auth-check
  GET  /api/whoami-v2, /api/agent-harnesses (empty registry), /healthz (not a Hub route)
  HEAD|GET /<repo>/resolve/<rev>/<path>                   hf_hub_download (ETag, X-Repo-Commit, Range)

Files are served directly (200/206, no CDN redirect) and no Xet headers are ever sent, so the client always
takes its plain HTTP path. For a benchmark (tests/bench/first_run.py) the packs can be scaled up (--pad,
$FAKEHUB_PAD: a padding tensor in matching shards, served without being held whole) and the server slowed down
like a slow link to the Hub (--rate, $FAKEHUB_RATE: bytes/s for all connections together; each connection is
answered at once and its body trickles at its share, as from a real slow server). Gated repos answer
their files and auth-check with 401 (no token), 403 (a token without access) or the content (an accepted token);
their metadata stays public, as on the Hub.
Standard library only.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repos as repo_data  # noqa: E402

TEXT_TYPES = {".json": "application/json", ".md": "text/markdown", ".jinja": "text/plain", ".py": "text/x-python",
              ".sh": "text/x-sh", "": "text/plain"}
_log_lock = threading.Lock()
SLICE_S = 0.1  # --rate: a body goes out in slices of this many seconds at the rate...
MIN_SLICE, MAX_SLICE = 256, 1 << 16  # ...bytes, within these bounds


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, commit: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.commit = status, message, code, commit


class Throttle:
    """One rate for every file byte the server sends, on all connections together: a slow link to the Hub (what
    parallel downloads share). A body goes out in slices of about a tenth of a second at the rate; each slice takes
    the next slot of the link and goes once its slot has passed, so every connection's bytes trickle at its share,
    as through a slow link, and none waits a whole chunk's time for its first byte (a client reading with a timeout
    would give up). Status lines, headers and API answers are never held back: each connection has its own thread,
    so a slow body never delays another connection."""

    def __init__(self, rate: float = 0):
        self.rate = rate
        self.lock = threading.Lock()
        self.free_at = 0.0
        self.slice = max(MIN_SLICE, min(MAX_SLICE, int(rate * SLICE_S))) if rate > 0 else MAX_SLICE

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            self.free_at = max(time.monotonic(), self.free_at) + n / self.rate
            until = self.free_at
        time.sleep(max(until - time.monotonic(), 0))

    def send(self, piece: bytes, write) -> None:
        """`piece` written with `write`, slice by slice, each at the rate."""
        for at in range(0, len(piece), self.slice):
            part = piece[at:at + self.slice]
            self.take(len(part))
            write(part)


class Hub:
    def __init__(self, tokens: set[str], cut_once: list[str] | None = None, pads: dict[str, int] | None = None,
                 rate: float = 0):
        self.repos = repo_data.padded(repo_data.build_repos(), pads) if pads else repo_data.build_repos()
        self.throttle = Throttle(rate)
        self.tokens = tokens
        # fault injection: the first full GET of a matching "<repo>/<path>" stops half-way (tests resume)
        self.cut_once = cut_once or []
        self.cut_done: set[str] = set()
        self.lock = threading.Lock()

    def should_cut(self, key: str) -> bool:
        with self.lock:
            if key in self.cut_done or not any(fnmatch.fnmatchcase(key, p) for p in self.cut_once):
                return False
            self.cut_done.add(key)
            return True

    def repo(self, repo_id: str) -> repo_data.Repo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    @staticmethod
    def commit(repo: repo_data.Repo, revision: str) -> str:
        rev = revision[len("refs/heads/"):] if revision.startswith("refs/heads/") else revision
        if rev in repo.branches:
            return repo.branches[rev]
        if rev == repo.commit:
            return repo.commit
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def check_access(self, repo: repo_data.Repo, token: str | None) -> None:
        if not repo.gated:
            return
        if token is None:
            raise HubError(401, f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                                "authenticated to access it. Please log in.", "GatedRepo")
        if not token.startswith("hf_"):
            raise HubError(401, "Invalid credentials in Authorization header")
        if token not in self.tokens:
            raise HubError(403, f"Access to model {repo.repo_id} is restricted and you are not in the authorized "
                                f"list. Visit https://huggingface.co/{repo.repo_id} to ask for access.", "GatedRepo")


def file_entry(f: repo_data.RepoFile) -> dict:
    entry = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
    if f.is_lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.lfs_pointer)}
    return entry


def folder_entry(repo: repo_data.Repo, path: str) -> dict:
    listing = "\n".join(p for p in repo.files if p.startswith(path + "/"))
    return {"type": "directory", "oid": hashlib.sha1(f"{repo.commit}:{path}:{listing}".encode()).hexdigest(),
            "size": 0, "path": path}


def tree(repo: repo_data.Repo, path: str, recursive: bool) -> list[dict]:
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    if prefix and prefix[:-1] in repo.files:
        raise HubError(404, f"{path} is a file, not a folder", "EntryNotFound", repo.commit)
    files, folders = [], {}
    for p, f in repo.files.items():
        if not p.startswith(prefix):
            continue
        rest = p[len(prefix):].split("/")
        # every folder between prefix and the file (only the first level unless recursive)
        for depth in range(1, len(rest) if recursive else min(len(rest), 2)):
            folder = prefix + "/".join(rest[:depth])
            folders.setdefault(folder, folder_entry(repo, folder))
        if recursive or len(rest) == 1:
            files.append(file_entry(f))
    if prefix and not files and not folders:
        raise HubError(404, f"{path} does not exist at this revision", "EntryNotFound", repo.commit)
    return list(folders.values()) + files


def model_info(repo: repo_data.Repo, commit: str, blobs: bool) -> dict:
    siblings = []
    for f in repo.files.values():
        sib = {"rfilename": f.path}
        if blobs:
            sib.update({"size": f.size, "blobId": f.blob_id})
            if f.is_lfs:
                sib["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": len(f.lfs_pointer)}
        siblings.append(sib)
    info = {
        "_id": commit[:24],
        "id": repo.repo_id,
        "modelId": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": commit,
        "lastModified": repo_data.LAST_MODIFIED,
        "createdAt": repo_data.LAST_MODIFIED,
        "private": False,
        "gated": "auto" if repo.gated else False,
        "disabled": False,
        "downloads": 0,
        "likes": 0,
        "tags": ["safetensors"],
        "library_name": None,
        "siblings": siblings,
        "usedStorage": sum(f.size for f in repo.files.values()),
    }
    config = repo.files.get("config.json")
    if config is not None:
        cfg = json.loads(config.data)
        info["config"] = {"architectures": cfg.get("architectures"), "model_type": cfg.get("model_type")}
    return info


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length
    server_version = "fakehub/1.0"
    hub: Hub  # set on the class by make_server

    # ------------------------------------------------------------ plumbing

    def log_message(self, fmt, *args):  # noqa: D102 - replaced by one line per request in _log
        pass

    def _log(self, status: int, sent: int, note: str = "") -> None:
        rng = self.headers.get("Range")
        auth = "token" if self.headers.get("Authorization") else "-"
        line = (f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {self.command} {self.path} {status} {sent}"
                f" auth={auth}" + (f" range={rng}" if rng else "") + note)
        with _log_lock:
            print(line, file=sys.stderr, flush=True)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip() or None
        return None

    def _send(self, status: int, body: bytes, headers: dict[str, str], content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._log(status, 0 if self.command == "HEAD" else len(body))

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers or {}, "application/json; charset=utf-8")

    def _error(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message}
        if err.code:
            headers["X-Error-Code"] = err.code
        if err.commit:
            headers["X-Repo-Commit"] = err.commit
        self._json({"error": err.message}, err.status, headers)

    def do_GET(self):  # noqa: N802
        self._dispatch()

    def do_HEAD(self):  # noqa: N802
        self._dispatch()

    def do_POST(self):  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        try:
            url = urlsplit(self.path)
            # split before unquoting: a revision like refs%2Fpr%2F1 is one segment
            parts = [unquote(p) for p in url.path.split("/")[1:]]
            query = parse_qs(url.query)
            self._route(parts, query)
        except HubError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug here must show up in the log, not as a hung client
            self._json({"error": f"internal error: {exc!r}"}, 500)

    def _route(self, parts: list[str], query: dict) -> None:
        hub = self.hub
        method = self.command
        if parts[:2] == ["api", "whoami-v2"] and method == "GET":
            return self._whoami()
        if parts == ["api", "agent-harnesses"] and method == "GET":  # fetched by huggingface_hub on first use
            return self._json({"standardEnvVars": [], "harnesses": {}})
        if parts == ["healthz"]:
            return self._json({"ok": True, "repos": {rid: r.commit for rid, r in hub.repos.items()}})
        if len(parts) >= 4 and parts[0] == "api" and parts[1] in ("models", "datasets", "spaces"):
            if parts[1] != "models":
                raise HubError(404, "Only model repositories are served here", "RepoNotFound")
            repo = hub.repo(f"{parts[2]}/{parts[3]}")
            rest = parts[4:]
            if not rest and method == "GET":
                return self._json(model_info(repo, repo.commit, _flag(query, "blobs")))
            if len(rest) == 2 and rest[0] == "revision" and method == "GET":
                return self._json(model_info(repo, hub.commit(repo, rest[1]), _flag(query, "blobs")))
            if len(rest) >= 2 and rest[0] == "tree" and method == "GET":
                hub.commit(repo, rest[1])
                return self._json(tree(repo, "/".join(rest[2:]), _flag(query, "recursive")))
            if len(rest) == 2 and rest[0] == "paths-info" and method == "POST":
                hub.commit(repo, rest[1])
                return self._json(self._paths_info(repo))
            if rest == ["refs"] and method == "GET":
                refs = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in repo.branches.items()]
                return self._json({"branches": refs, "converts": [], "tags": [], "pullRequests": []})
            if len(rest) == 2 and rest[0] == "commits" and method == "GET":
                commit = hub.commit(repo, rest[1])
                return self._json([{"id": commit, "title": "Upload simulated files", "message": "",
                                    "authors": [{"user": repo.repo_id.split("/")[0]}],
                                    "date": repo_data.LAST_MODIFIED}])
            if rest == ["auth-check"] and method == "GET":
                hub.check_access(repo, self._token())
                return self._json({})
            raise HubError(404, f"Unknown API route {self.path}")
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]))
        raise HubError(404, f"Not found: {self.path}")

    # ------------------------------------------------------------ routes

    def _whoami(self) -> None:
        token = self._token()
        if token is None or not token.startswith("hf_"):
            raise HubError(401, "Invalid credentials in Authorization header")
        access = token in self.hub.tokens
        self._json({"type": "user", "id": "sim-user", "name": "sim-user" if access else "sim-other",
                    "fullname": "Simulated user", "orgs": [], "canPay": False,
                    "auth": {"type": "access_token", "accessToken": {"displayName": "sim", "role": "read"}}})

    def _paths_info(self, repo: repo_data.Repo) -> list[dict]:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(body or "{}").get("paths", [])
        else:
            paths = parse_qs(body).get("paths", [])
        out = []
        for p in paths:
            p = p.strip("/")
            if p in repo.files:
                out.append(file_entry(repo.files[p]))
            elif any(q.startswith(p + "/") for q in repo.files):
                out.append(folder_entry(repo, p))
        return out

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        hub = self.hub
        repo = hub.repo(repo_id)
        commit = hub.commit(repo, revision)
        hub.check_access(repo, self._token())
        f = repo.files.get(path)
        if f is None:
            raise HubError(404, "Entry not found", "EntryNotFound", commit)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{f.etag}"', "Accept-Ranges": "bytes"}
        if f.is_lfs:
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
        ext = os.path.splitext(path)[1]
        ctype = TEXT_TYPES.get(ext, "application/octet-stream") if not f.is_lfs else "application/octet-stream"
        status, start, end = 200, 0, f.size
        rng = _parse_range(self.headers.get("Range"), f.size)
        if rng == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{f.size}"
            self._send(416, b"", headers, ctype)
            return
        if rng is not None:
            status, (start, end) = 206, (rng[0], rng[1] + 1)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        elif self.command == "GET" and f.size > 1 and hub.should_cut(f"{repo_id}/{path}"):
            return self._send_cut(b"".join(f.read()), headers, ctype)
        self._send_file(status, f, start, end, headers, ctype)

    def _send_file(self, status: int, f: repo_data.RepoFile, start: int, end: int, headers: dict[str, str],
                   ctype: str) -> None:
        """Bytes start..end of `f`, in chunks, each at the server's rate (--rate)."""
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(end - start))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        if self.command != "HEAD":
            for piece in f.read(start, end):
                self.hub.throttle.send(piece, self.wfile.write)
                sent += len(piece)
        self._log(status, sent)

    def _send_cut(self, body: bytes, headers: dict[str, str], ctype: str) -> None:
        """Announce the whole file, send half of it, drop the connection (a network cut mid-download)."""
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True
        self._log(200, len(body) // 2, " cut")


def parse_pads(specs: list[str]) -> dict[str, int]:
    """["GLOB=BYTES", ...] -> {GLOB: BYTES}."""
    pads = {}
    for spec in specs:
        pattern, _, size = spec.rpartition("=")
        if not pattern or not size.isdigit():
            raise SystemExit(f"fakehub: --pad {spec!r} is not GLOB=BYTES")
        pads[pattern] = int(size)
    return pads


def _flag(query: dict, name: str) -> bool:
    return any(v.lower() in ("1", "true", "yes") for v in query.get(name, []))


def _parse_range(value: str | None, size: int):
    """(start, end) inclusive for one `bytes=` range; None serves the whole file; 'unsatisfiable' for 416."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    spec = value[len("bytes="):].strip()
    start_s, _, end_s = spec.partition("-")
    try:
        if start_s == "":
            n = int(end_s)
            if n <= 0:
                return "unsatisfiable"
            return (max(size - n, 0), size - 1) if size else "unsatisfiable"
        start = int(start_s)
        end = int(end_s) if end_s else size - 1
    except ValueError:
        return None
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)


def make_server(host: str, port: int, tokens: set[str], cut_once: list[str] | None = None,
                pads: dict[str, int] | None = None, rate: float = 0) -> ThreadingHTTPServer:
    handler = type("FakeHubHandler", (Handler,), {"hub": Hub(tokens, cut_once, pads, rate)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default=os.environ.get("FAKEHUB_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("FAKEHUB_PORT", "5555")))
    ap.add_argument("--token", action="append", default=None,
                    help="token with access to gated repos (repeatable; default $FAKEHUB_TOKENS or hf_simtoken)")
    ap.add_argument("--cut-once", action="append", default=[], metavar="GLOB",
                    help="the first full GET of a matching <repo>/<path> stops half-way, once (resume tests)")
    ap.add_argument("--pad", action="append", default=[], metavar="GLOB=BYTES",
                    help="each safetensors file whose <repo>/<path> matches GLOB gets a padding tensor of BYTES (a "
                         "pack scaled up for a benchmark; default $FAKEHUB_PAD, comma-separated)")
    ap.add_argument("--rate", default=os.environ.get("FAKEHUB_RATE", "0"), metavar="BYTES_PER_S",
                    help="send file bytes at most this fast, all connections together (0: unlimited)")
    args = ap.parse_args(argv)
    tokens = set(args.token or os.environ.get("FAKEHUB_TOKENS", "hf_simtoken").split(","))
    cut_once = args.cut_once or [p for p in os.environ.get("FAKEHUB_CUT_ONCE", "").split(",") if p]
    pads = parse_pads(args.pad or [p for p in os.environ.get("FAKEHUB_PAD", "").split(",") if p])
    server = make_server(args.host, args.port, {t for t in tokens if t}, cut_once, pads, float(args.rate))
    host, port = server.server_address[:2]
    summary = ", ".join(f"{rid}@{r.commit[:8]}" for rid, r in server.RequestHandlerClass.hub.repos.items())
    print(f"fakehub listening on http://{host}:{port} serving {summary}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
