#!/bin/sh
# Apply the engine patch series: every PATCH_DIR/*.patch, in filename order, to the checkout at ENGINE_DIR.
# Each patch is checked first (git apply --check) so a patch that does not apply stops the build, named,
# before anything of it is written. The Dockerfile runs this same script; tests/unit/test_patches.py runs it too.
# Usage: apply-patches.sh PATCH_DIR ENGINE_DIR
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: apply-patches.sh PATCH_DIR ENGINE_DIR" >&2
    exit 2
fi
patch_dir=$1
engine_dir=$2
[ -d "$patch_dir" ] || { echo "apply-patches: no patch directory $patch_dir" >&2; exit 2; }
[ -d "$engine_dir" ] || { echo "apply-patches: no engine checkout $engine_dir" >&2; exit 2; }
patch_dir=$(cd "$patch_dir" && pwd)
cd "$engine_dir"

# Byte order, not the locale's, decides "filename order".
LC_ALL=C
export LC_ALL
applied=0
for patch in "$patch_dir"/*.patch; do
    [ -e "$patch" ] || continue # the series is empty
    name=$(basename "$patch")
    if ! git apply --check "$patch"; then
        echo "apply-patches: $name does not apply to the engine checkout; stopping (fix or refresh zig/patches/$name)" >&2
        exit 1
    fi
    git apply "$patch"
    applied=$((applied + 1))
    echo "apply-patches: applied $name"
done
echo "apply-patches: $applied patch(es) applied"
