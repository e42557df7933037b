"""A stand-in `docker` for unit tests: `docker run ... -v SRC:DST[:ro] ... --entrypoint TOOL IMAGE ARGS` runs a tiny
imitation of the engine image's tools on the host paths behind the mounts (no Docker, no network).

Tools: tf-dsv41-rank-cache MODEL OUT RANK WORLD (refuses a folder that holds a file for its rank, like the real one);
python3 make_token_map.py MODEL OUT; python3 apply_mia_exl3_wob.py --src S --wo-b F --dst D (writes one new shard).
Every call is appended to $FAKE_DOCKER_LOG.
"""

import hashlib
import os
import sys


def main(argv):
    with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
        log.write(" ".join(argv) + "\n")
    mounts, i, entry = [], 2, None  # argv: fake_docker.py run ...
    while i < len(argv):
        a = argv[i]
        if a == "-v":
            src, dst, *ro = argv[i + 1].split(":")
            mounts.append((dst, src, bool(ro)))
            i += 2
        elif a == "--entrypoint":
            entry = argv[i + 1]
            i += 2
        elif a in ("-e", "--user", "--network"):
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            break
    args = argv[i + 1:]  # after the image

    def host(path):
        for dst, src, ro in sorted(mounts, key=lambda m: -len(m[0])):
            if path == dst or path.startswith(dst + "/"):
                return src + path[len(dst):], ro
        raise SystemExit(f"fake docker: {path} is not mounted")

    if entry == "tf-dsv41-rank-cache":
        model, out, rank = host(args[0])[0], host(args[1])[0], args[2]
        if any(n.startswith(f"rank{rank}of2-") for n in os.listdir(out)):
            print(f"{out} already holds a file for rank {rank}", file=sys.stderr)
            return 1
        index = open(os.path.join(model, "model.safetensors.index.json"), "rb").read()
        name = f"rank{rank}of2-{hashlib.sha256(index + rank.encode()).hexdigest()[:20]}.bin"
        open(os.path.join(out, name), "wb").write(b"weights for rank " + rank.encode())
        return 0
    if entry == "python3" and args[0].endswith("make_token_map.py"):
        host(args[1])
        out, ro = host(args[2])
        open(out, "w").write("[0, 1]")
        return 0
    if entry == "python3" and args[0].endswith("apply_mia_exl3_wob.py"):
        src = host(args[args.index("--src") + 1])[0]
        dst = host(args[args.index("--dst") + 1])[0]
        assert os.path.isfile(os.path.join(src, "model.safetensors.index.json")), "--src is not a pack"
        os.makedirs(dst)  # like the real script: only the rewritten shard is new
        open(os.path.join(dst, "model-00002-of-00002.safetensors"), "wb").write(b"abliterated shard")
        return 0
    print(f"fake docker: unknown tool {entry} {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
