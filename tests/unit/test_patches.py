"""The engine build's shell, run for real: zig/apply-patches.sh on a scratch git repository, and the Dockerfile's
checkout step against a local engine repository (git only; no Docker, no network)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPLY = ROOT / "zig" / "apply-patches.sh"
DOCKERFILE = ROOT / "zig" / "Dockerfile"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def make_engine(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "deepseek-v41-zig")
    (path / "zig").mkdir()
    (path / "zig" / "engine.zig").write_text("const lanes = 4;\nconst sm = 120;\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "engine")
    return path


def make_patch(engine: Path, out: Path, edit) -> Path:
    """Apply `edit` to the work tree, save `git diff` as `out`, keep the change (the next patch builds on it)."""
    edit(engine)
    git(engine, "add", "-A")
    out.write_text(git(engine, "diff", "--cached"))
    git(engine, "commit", "-q", "-m", out.name)
    return out


def run_apply(patches: Path, engine: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(APPLY), str(patches), str(engine)], capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV})


@pytest.fixture
def series(tmp_path: Path):
    """A series written against a first copy of the engine; returns (patch dir, fresh engine to apply to)."""
    author = make_engine(tmp_path / "author")
    patches = tmp_path / "patches"
    patches.mkdir()
    engine_zig = lambda e: e / "zig" / "engine.zig"  # noqa: E731
    make_patch(author, patches / "0001-sm121.patch",
               lambda e: engine_zig(e).write_text("const lanes = 4;\nconst sm = 121;\n"))
    # 0002 edits the line 0001 wrote: it applies only after 0001, so the order is observable.
    make_patch(author, patches / "0002-sm-comment.patch",
               lambda e: engine_zig(e).write_text("const lanes = 4;\nconst sm = 121; // GB10\n"))
    make_patch(author, patches / "0010-notes.patch",
               lambda e: (e / "zig" / "NOTES").write_text("patched\n"))
    (patches / "README.md").write_text("not a patch\n")
    return patches, make_engine(tmp_path / "engine")


def test_good_series_applies_in_filename_order(series):
    patches, engine = series
    result = run_apply(patches, engine)
    assert result.returncode == 0, result.stderr
    assert (engine / "zig" / "engine.zig").read_text() == "const lanes = 4;\nconst sm = 121; // GB10\n"
    assert (engine / "zig" / "NOTES").read_text() == "patched\n"
    applied = re.findall(r"applied (\S+\.patch)", result.stdout)
    assert applied == ["0001-sm121.patch", "0002-sm-comment.patch", "0010-notes.patch"]


def test_a_patch_that_does_not_apply_stops_the_series_named(series, tmp_path):
    patches, engine = series
    # Written against a different engine: its context line does not exist in ours.
    other = make_engine(tmp_path / "other")
    (other / "zig" / "engine.zig").write_text("const lanes = 8;\nconst sm = 120;\n")
    git(other, "commit", "-q", "-am", "lanes 8")
    make_patch(other, patches / "0003-lanes-16.patch",
               lambda e: (e / "zig" / "engine.zig").write_text("const lanes = 16;\nconst sm = 120;\n"))
    result = run_apply(patches, engine)
    assert result.returncode != 0
    assert "0003-lanes-16.patch does not apply" in result.stderr
    # 0001 and 0002 went in, in order; 0003 left nothing behind; 0010 (after it) was not tried.
    assert (engine / "zig" / "engine.zig").read_text() == "const lanes = 4;\nconst sm = 121; // GB10\n"
    assert not (engine / "zig" / "NOTES").exists()
    assert re.findall(r"applied (\S+\.patch)", result.stdout) == ["0001-sm121.patch", "0002-sm-comment.patch"]


def test_empty_series_changes_nothing(tmp_path):
    engine = make_engine(tmp_path / "engine")
    empty = tmp_path / "patches"
    empty.mkdir()
    (empty / "README.md").write_text("the series may be empty\n")
    result = run_apply(empty, engine)
    assert result.returncode == 0, result.stderr
    assert "0 patch(es) applied" in result.stdout
    assert git(engine, "status", "--porcelain") == ""


def test_project_series_is_named_and_each_patch_has_its_origin_recorded():
    folder = ROOT / "zig" / "patches"
    readme = (folder / "README.md").read_text()
    assert "| patch | origin |" in readme
    for path in folder.iterdir():
        if path.name == "README.md":
            continue
        assert re.fullmatch(r"\d{4}-[a-z0-9][a-z0-9.-]*\.patch", path.name), f"{path.name}: name it NNNN-name.patch"
        assert f"| {path.name} |" in readme or f"| `{path.name}` |" in readme, f"{path.name}: no origin row"
        assert path.read_text().startswith(("diff --git ", "From ")) or "\ndiff --git " in path.read_text()


def test_usage_errors(tmp_path):
    result = subprocess.run(["sh", str(APPLY), str(tmp_path / "none"), str(tmp_path)], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "no patch directory" in result.stderr


# --- the Dockerfile's shell ---


def run_steps() -> list[str]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line[4:] for line in joined.splitlines() if line.startswith("RUN ")]


def test_every_run_step_is_valid_sh():
    steps = run_steps()
    assert len(steps) >= 6
    for step in steps:
        result = subprocess.run(["sh", "-n", "-c", step], capture_output=True, text=True)
        assert result.returncode == 0, (step[:80], result.stderr)


def test_dockerfile_runs_this_script_on_the_copied_series():
    text = DOCKERFILE.read_text()
    assert "COPY apply-patches.sh /opt/sparkfold/apply-patches.sh" in text
    assert "COPY patches/ /opt/sparkfold/patches/" in text
    assert "sh /opt/sparkfold/apply-patches.sh /opt/sparkfold/patches /src/tensorfold" in run_steps()
    for arg in ("BASE_IMAGE", "ZIG_VERSION", "ZIG_URL", "ZIG_SHA256", "TF_REPO", "TF_REF", "TOOLS_REF", "IMAGE_HASH"):
        assert re.search(rf"^ARG {arg}=", text, re.M), arg
    assert "LABEL sparkfold.image-hash=${IMAGE_HASH}" in text


def checkout(tmp_path: Path, tf_ref: str, tools_ref: str, repo: Path) -> subprocess.CompletedProcess:
    step = next(s for s in run_steps() if "checkout()" in s).replace("/src/", f"{tmp_path}/src/")
    env = {**os.environ, **GIT_ENV, "TF_REPO": f"file://{repo}", "TF_REF": tf_ref, "TF_BRANCH": "deepseek-v41-zig",
           "TOOLS_REF": tools_ref, "TOOLS_BRANCH": "deepseek-v41-zig"}
    return subprocess.run(["sh", "-c", step], capture_output=True, text=True, env=env)


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str, str]:
    repo = make_engine(tmp_path / "upstream")
    old = git(repo, "rev-parse", "HEAD").strip()
    (repo / "zig" / "engine.zig").write_text("const lanes = 2;\n")
    git(repo, "commit", "-q", "-am", "tip")
    return repo, old, git(repo, "rev-parse", "HEAD").strip()


def test_checkout_pins_full_and_short_shas(tmp_path, upstream):
    repo, old, tip = upstream
    result = checkout(tmp_path, old[:7], tip, repo)  # engine by short SHA (not the tip), tools by full SHA
    assert result.returncode == 0, result.stderr
    assert git(tmp_path / "src" / "tensorfold", "rev-parse", "HEAD").strip() == old
    assert git(tmp_path / "src" / "tools", "rev-parse", "HEAD").strip() == tip


@pytest.mark.parametrize("ref, message", [("deepseek-v41-zig", "is not a commit SHA"),
                                          ("0000000", "is not a commit on deepseek-v41-zig")])
def test_checkout_refuses_what_is_not_a_pin(tmp_path, upstream, ref, message):
    repo, _, tip = upstream
    result = checkout(tmp_path, ref, tip, repo)
    assert result.returncode != 0
    assert message in result.stderr
