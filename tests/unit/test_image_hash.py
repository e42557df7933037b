"""The image hash: changes with the build context's files and the build arguments, and with nothing else."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from operations.build.image_hash import build_args, context_files, image_hash

ROOT = Path(__file__).resolve().parents[2]

ARGS = {
    "BASE_IMAGE": "nvcr.io/nvidia/pytorch:26.07-py3",
    "ZIG_VERSION": "0.17.0",
    "ZIG_URL": "https://ziglang.org/download/0.17.0/zig-aarch64-linux-0.17.0.tar.xz",
    "ZIG_SHA256": "9e8d11661d4ae3bd57702a3832781e23ad151dde5798e16a5ccd503f65234ff8",
    "TF_REPO": "https://github.com/bertholomus/TensorFold.git",
    "TF_REF": "fbbc971",
    "TOOLS_REF": "59402086381a42c74d53053443224eec2790b4c5",
}


@pytest.fixture
def ctx(tmp_path: Path) -> Path:
    root = tmp_path / "ctx"
    (root / "patches").mkdir(parents=True)
    (root / "Dockerfile").write_text("FROM base\nRUN build\n")
    (root / "apply-patches.sh").write_text("#!/bin/sh\necho apply\n")
    (root / ".dockerignore").write_text("**/*.md\n")
    (root / "patches" / "0001-one.patch").write_text("diff --git a/x b/x\n+one\n")
    (root / "patches" / "0002-two.patch").write_text("diff --git a/y b/y\n+two\n")
    (root / "patches" / "README.md").write_text("# notes\n")
    return root


def test_hash_is_12_hex_and_deterministic(ctx):
    first = image_hash(ctx, ARGS)
    assert len(first) == 12 and int(first, 16) >= 0
    assert image_hash(ctx, dict(reversed(list(ARGS.items())))) == first  # argument order does not matter


@pytest.mark.parametrize(
    "edit",
    [
        lambda c: (c / "patches" / "0001-one.patch").write_text("diff --git a/x b/x\n+ONE\n"),
        lambda c: (c / "patches" / "0003-three.patch").write_text("diff --git a/z b/z\n+three\n"),
        lambda c: (c / "patches" / "0002-two.patch").unlink(),
        lambda c: (c / "patches" / "0001-one.patch").rename(c / "patches" / "0005-one.patch"),
        lambda c: (c / "Dockerfile").write_text("FROM base\nRUN build --fast\n"),
        lambda c: (c / "apply-patches.sh").write_text("#!/bin/sh\necho apply; exit 0\n"),
        lambda c: (c / "extra.txt").write_text("a new file in the context\n"),
    ],
    ids=["patch-edited", "patch-added", "patch-removed", "patch-renamed", "dockerfile", "apply-script", "new-file"],
)
def test_context_edits_change_the_hash(ctx, edit):
    before = image_hash(ctx, ARGS)
    edit(ctx)
    assert image_hash(ctx, ARGS) != before


@pytest.mark.parametrize("name", sorted(ARGS))
def test_each_build_argument_changes_the_hash(ctx, name):
    changed = dict(ARGS, **{name: ARGS[name] + "x"})
    assert image_hash(ctx, changed) != image_hash(ctx, ARGS)


def test_a_new_build_argument_changes_the_hash(ctx):
    assert image_hash(ctx, dict(ARGS, EXTRA="1")) != image_hash(ctx, ARGS)


def test_mtime_mode_location_and_ignored_files_do_not_change_it(ctx, tmp_path):
    before = image_hash(ctx, ARGS)
    patch = ctx / "patches" / "0001-one.patch"
    os.utime(patch, (1_000_000, 1_000_000))
    os.chmod(ctx / "apply-patches.sh", 0o755)
    (ctx / "patches" / "README.md").write_text("# notes, rewritten\n")  # excluded by .dockerignore
    (tmp_path / "outside.patch").write_text("not in the context\n")
    assert image_hash(ctx, ARGS) == before
    moved = shutil.copytree(ctx, tmp_path / "elsewhere" / "zig")
    assert image_hash(moved, ARGS) == before


def test_field_boundaries_are_unambiguous(ctx):
    # Moving bytes from one file's content into another's path must not collide.
    a = image_hash(ctx, {"A": "bc"})
    b = image_hash(ctx, {"Ab": "c"})
    assert a != b


def test_context_files_sorted_and_dockerignore_honoured(ctx):
    (ctx / ".dockerignore").write_text("# docs\n**/*.md\n!patches/KEEP.md\nscratch\nDockerfile\n")
    (ctx / "patches" / "KEEP.md").write_text("kept\n")
    (ctx / "scratch").mkdir()
    (ctx / "scratch" / "junk.bin").write_bytes(b"\0")
    assert context_files(ctx) == [
        ".dockerignore",
        "Dockerfile",  # Docker sends the Dockerfile even when it is listed
        "apply-patches.sh",
        "patches/0001-one.patch",
        "patches/0002-two.patch",
        "patches/KEEP.md",
    ]


def test_missing_context_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="engine build context"):
        image_hash(tmp_path / "nope", ARGS)


def test_project_context_leaves_docs_out():
    files = context_files(ROOT / "zig")
    assert {"Dockerfile", "apply-patches.sh", ".dockerignore"} <= set(files)
    assert not [f for f in files if f.endswith(".md")]
    assert all(f.endswith(".patch") for f in files if f.startswith("patches/"))


def test_build_args_from_settings():
    s = SimpleNamespace(base_image="b", zig_version="v", zig_url="u", zig_sha256="h", tf_repo="r", tf_ref="t",
                        tools_ref="o", engine_image="ignored", prebuilt_image="")
    assert build_args(s) == {"BASE_IMAGE": "b", "ZIG_VERSION": "v", "ZIG_URL": "u", "ZIG_SHA256": "h",
                             "TF_REPO": "r", "TF_REF": "t", "TOOLS_REF": "o"}
