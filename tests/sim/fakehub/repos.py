"""The repositories the fake Hugging Face endpoint serves to the simulated pair.

Every byte is derived from fixed seeds, so two builds (the server in the simulated head and a test on the
controller) agree on every size, sha256 and commit. Files are tiny but shaped like the real ones: valid
safetensors headers, an HF tokenizers JSON, a kit/ folder with a sha256sum MANIFEST, a gated overlay repo with
its apply script. Standard library only (it runs inside the simulated Sparks).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import struct
import unicodedata
from dataclasses import dataclass, field, replace
from functools import cached_property

EAQ_V1 = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw"
EAQ_V1_1 = "Mia-AiLab/DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1.1-2.9-bpw"
ENGRAM = "deepseek-ai/DeepSeek-V4.1-Flash-1017"
KIT = "bertholomus/DeepSeek-V4.1-Flash-TensorFold-TP2-2xGB10"
ABLIT = "drowzeys/DeepSeek-V4.1-Flash-Abliterated-Cybersecurity-Unleashed"

# Fixed commit of each repo ("main" points at it). ABLIT's is the pin in group_data/all.py (ablit_revision).
COMMITS = {
    EAQ_V1: "3f1c7a9e52d04b8e9a61c2f0d7b5e4a8c9126d03",
    EAQ_V1_1: "b82e41d0c6f93a57e1d8b2c4a09f6e3d7c5b1a28",
    ENGRAM: "e7d5c0a1b9f84263d1e0a7c5b3f2968d4e1c7b90",
    KIT: "5e90ec93d2b1a7f4c8e6d0b3a9f1e2c7d4b8a6f1",
    ABLIT: "87bb9850e6f49fd20ad9c8516b7817215cbbf5fc",
}
GATED = {ABLIT}
LAST_MODIFIED = "2025-10-17T12:00:00.000Z"

# Suffixes stored in Git LFS (.gitattributes below): served with the sha256 as ETag, like the Hub does.
LFS_SUFFIXES = (".safetensors", ".cubin", ".f32")

# Tiny model geometry shared by the packs and the Engram source (the tables' rows follow from it).
NUM_LAYERS = 40
ENGRAM_LAYERS = (1, 14)
ENGRAM_ROWS = (24, 40)
ENGRAM_HEAD_DIM = 256
HIDDEN = 16
ABLIT_LAYERS = range(10, 36)  # layers 10..35 attn.wo_b, as the real overlay
WO_B_PARTS = {"trellis": ("I16", [16, 8]), "suh": ("F16", [16]), "svh": ("F16", [16]), "mul1": ("I32", [1])}
DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I16": 2, "I32": 4, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


@dataclass(frozen=True)
class RepoFile:
    path: str
    data: bytes = field(repr=False)
    pad: int = 0  # a padding tensor of this many bytes after the data (a pack scaled up: padded())

    @cached_property
    def body(self) -> bytes:
        """The bytes before the padding: the data, its safetensors header naming the padding tensor when padded."""
        return padded_header(self.data, self.pad) if self.pad else self.data

    @property
    def size(self) -> int:
        return len(self.body) + self.pad

    def read(self, start: int = 0, end: int | None = None, chunk: int = 1 << 16):
        """The file's bytes from start to end (exclusive), in chunks: a padded file is never held whole."""
        end = self.size if end is None else end
        while start < end:
            if start < len(self.body):
                piece = self.body[start:min(end, len(self.body), start + chunk)]
            else:
                offset = (start - len(self.body)) % len(PAD_BLOCK)
                piece = PAD_BLOCK[offset:offset + min(chunk, end - start)]
            yield piece
            start += len(piece)

    @cached_property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for piece in self.read(chunk=1 << 20):
            digest.update(piece)
        return digest.hexdigest()

    @property
    def is_lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def lfs_pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def blob_id(self) -> str:
        """Git blob oid: of the LFS pointer for LFS files, of the content otherwise (as on the Hub)."""
        body = self.lfs_pointer if self.is_lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()

    @property
    def etag(self) -> str:
        """What huggingface_hub names the blob after: sha256 for LFS files, the git oid otherwise."""
        return self.sha256 if self.is_lfs else self.blob_id


@dataclass(frozen=True)
class Repo:
    repo_id: str
    commit: str
    files: dict  # path -> RepoFile, in a fixed order
    gated: bool = False

    @property
    def branches(self) -> dict:
        return {"main": self.commit}


# ---------------------------------------------------------------- deterministic bytes and formats


def det_bytes(seed: str, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:n])


PAD_BLOCK = det_bytes("sparkfold-sim padding", 1 << 20)  # a padded file's padding: this MiB repeated


def det_ints(seed: str, count: int, modulo: int) -> list[int]:
    raw = det_bytes(seed, 8 * count)
    return [int.from_bytes(raw[i * 8 : i * 8 + 8], "little") % modulo for i in range(count)]


def safetensors(tensors: list[tuple[str, str, list[int], bytes]], metadata: dict | None = None) -> bytes:
    """A valid safetensors file: u64 LE header length, JSON header (space-padded to 8), then the data."""
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape, data in tensors:
        expect = DTYPE_SIZE[dtype]
        for dim in shape:
            expect *= dim
        if expect != len(data):
            raise ValueError(f"{name}: {len(data)} bytes for {dtype}{shape}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(t[3] for t in tensors)


PAD_TENSOR = "sparkfold_sim.pad"  # what a padded shard's header calls its padding (nothing reads it)


def padded_header(data: bytes, pad: int) -> bytes:
    """A safetensors file's bytes with a U8 tensor of `pad` bytes declared after its data (the bytes themselves are
    PAD_BLOCK repeated, served after these): the file stays valid safetensors."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    end = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    header[PAD_TENSOR] = {"dtype": "U8", "shape": [pad], "data_offsets": [end, end + pad]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:]


def padded(repos: dict, pads: dict[str, int]) -> dict:
    """The repos with each LFS safetensors file whose "<repo>/<path>" matches a pattern of `pads` padded by its
    bytes: a pack with the real one's proportions, for a benchmark (tests/bench/first_run.py). Its commit stays."""
    out = {}
    for repo_id, repo in repos.items():
        files = {}
        for path, f in repo.files.items():
            extra = next((n for pattern, n in pads.items() if fnmatch.fnmatchcase(f"{repo_id}/{path}", pattern)), 0)
            files[path] = replace(f, pad=extra) if extra and path.endswith(".safetensors") else f
        out[repo_id] = replace(repo, files=files)
    return out


def tensor(name: str, dtype: str, shape: list[int], seed: str) -> tuple[str, str, list[int], bytes]:
    n = DTYPE_SIZE[dtype]
    for dim in shape:
        n *= dim
    return (name, dtype, shape, det_bytes(f"{seed}/{name}", n))


def jdump(obj) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()


def gitattributes(extra: tuple[str, ...] = ()) -> RepoFile:
    lines = [f"*{suffix} filter=lfs diff=lfs merge=lfs -text" for suffix in LFS_SUFFIXES + extra]
    return RepoFile(".gitattributes", ("\n".join(lines) + "\n").encode())


# ---------------------------------------------------------------- tokenizer and its compressed vocabulary


def _byte_unicode() -> dict[int, str]:
    """The byte-level alphabet of GPT-2 style tokenizers: printable bytes map to themselves, the rest above 255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _byte_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

SPECIAL_TOKENS = [
    ("<｜begin▁of▁sentence｜>", True),
    ("<｜end▁of▁sentence｜>", True),
    ("<｜▁pad▁｜>", True),
    ("<｜User｜>", True),
    ("<｜Assistant｜>", True),
    ("<think>", False),
    ("</think>", False),
]
# Byte-level tokens chosen so that several share one normalized text ("the"/"Ġthe"/"THE", "é"/"e", the blanks)
# and one is a partial UTF-8 byte (keyed by its raw token string).
WORD_TOKENS = (
    "t h e th the Ġthe The ĠThe THE Ġ Ċ ĠĠ ĊĊ ĉ a Ġa A Ġand and And Ġof of Ġto to Ġin in Ġis Ġit It "
    "Ġmodel model ĠModel ĠSpark Spark Ġfold Ġcafe ĠcafÃ© Ã© Ã 0 1 2 Ġ2025 . , ? ! : Ġ{ }"
).split(" ")
MERGES = ["t h", "th e", "Ġ the", "Ġ Ġ", "Ċ Ċ", "Ġ a"]


def tokenizer_vocab() -> list[tuple[str, bool, bool]]:
    """(token, is_added, is_special) by id."""
    return [(t, True, s) for t, s in SPECIAL_TOKENS] + [(t, False, False) for t in WORD_TOKENS]


def tokenizer_json() -> dict:
    vocab = tokenizer_vocab()
    if len({t for t, _, _ in vocab}) != len(vocab):
        raise ValueError("duplicate token in the simulated vocabulary")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": special}
        for i, (t, is_added, special) in enumerate(vocab) if is_added
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, (t, _, _) in enumerate(vocab)},
            "merges": MERGES,
        },
    }


def _decode_one(token: str, is_added: bool) -> str:
    if is_added:
        return token
    return bytes(CHAR_TO_BYTE[c] for c in token).decode("utf-8", errors="replace")


def _normalize(text: str) -> str:
    """NFKC, NFD, strip accents, lowercase, blanks to one space (a lone space survives), strip."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(c for c in text if unicodedata.category(c) != "Mn").lower()
    text = re.sub(r"[ \t\r\n]+", " ", text)
    return " " if text == " " else text.strip()


def compressed_token_map() -> list[int]:
    """Token id -> compressed id, the rule make_token_map.py applies (engram_compressed_vocab_size = its range)."""
    keys: dict[str, int] = {}
    out = []
    for token, is_added, _ in tokenizer_vocab():
        text = _decode_one(token, is_added)
        key = token if "\ufffd" in text else (_normalize(text) or text)
        out.append(keys.setdefault(key, len(keys)))
    return out


def compressed_vocab_size() -> int:
    return len(set(compressed_token_map()))


# ---------------------------------------------------------------- model config shared by the repos


def model_config(quant: dict) -> dict:
    vocab = len(tokenizer_vocab())
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "q_lora_rank": 1280,
        "o_lora_rank": 1024,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "max_position_embeddings": 1048576,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536},
        "bos_token_id": 0,
        "eos_token_id": 1,
        "engram_layer_ids": list(ENGRAM_LAYERS),
        "engram_num_embeddings": list(ENGRAM_ROWS),
        "engram_max_ngram_size": 4,
        "engram_vocab_size": 16000000,
        "engram_n_heads": 8,
        "engram_head_dim": ENGRAM_HEAD_DIM,
        "engram_pad_token_id": 2,
        "engram_compressed_vocab_size": compressed_vocab_size(),
        "dspark_block_size": 5,
        "dspark_target_layer_ids": [37, 38, 39],
        "quantization_config": quant,
        "sim_note": "tiny simulated checkpoint served by tests/sim/fakehub",
    }


def index_json(tensors_by_shard: dict[str, list]) -> bytes:
    weight_map = {}
    total = 0
    for shard, tensors in tensors_by_shard.items():
        for name, _, _, data in tensors:
            weight_map[name] = shard
            total += len(data)
    return jdump({"metadata": {"total_size": total}, "weight_map": weight_map})


def wo_b_name(layer: int, part: str) -> str:
    return f"model.layers.{layer}.attn.wo_b.{part}"


# ---------------------------------------------------------------- the repos


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>{% endif %}\n"
)


def eaq_pack(repo_id: str, version: str) -> Repo:
    seed = f"{repo_id}@{version}"
    shard_layers = [range(0, 14), range(14, 28), range(28, NUM_LAYERS)]
    vocab = len(tokenizer_vocab())
    tensors_by_shard: dict[str, list] = {}
    for k, layers in enumerate(shard_layers, start=1):
        name = f"model-{k:05d}-of-00003.safetensors"
        tensors = []
        if k == 1:
            tensors.append(tensor("model.embed_tokens.weight", "BF16", [vocab, HIDDEN], seed))
        for layer in layers:
            tensors.append(tensor(f"model.layers.{layer}.attn_norm.weight", "BF16", [HIDDEN], seed))
            for part, (dtype, shape) in WO_B_PARTS.items():
                tensors.append(tensor(wo_b_name(layer, part), dtype, shape, seed))
        if k == len(shard_layers):
            tensors.append(tensor("model.norm.weight", "BF16", [HIDDEN], seed))
            tensors.append(tensor("lm_head.weight", "BF16", [vocab, HIDDEN], seed))
        tensors_by_shard[name] = tensors
    quant = {"quant_method": "exl3", "format": "exl3-mul1", "bits": 2.9, "head_bits": 6, "eaq_version": version,
             "codebook": "mul1", "K": 5}
    generation = {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95}
    readme = (
        f"---\nlicense: mit\nbase_model: {ENGRAM}\ntags: [exl3, eaq]\n---\n"
        f"# {repo_id.split('/')[1]} (simulated)\n\nEXL3 EAQ v{version} 2.9 bpw pack, tiny stand-in for the sparkfold "
        "simulated pair. The Engram tables are not in this pack: fetch shards 47 and 48 of the original.\n"
    )
    files = [
        gitattributes(),
        RepoFile("README.md", readme.encode()),
        RepoFile("config.json", jdump(model_config(quant))),
        RepoFile("generation_config.json", jdump(generation)),
        RepoFile("chat_template.jinja", CHAT_TEMPLATE.encode()),
        RepoFile("tokenizer.json", jdump(tokenizer_json())),
        RepoFile("model.safetensors.index.json", index_json(tensors_by_shard)),
    ]
    files += [RepoFile(n, safetensors(t)) for n, t in tensors_by_shard.items()]
    return make_repo(repo_id, files)


def engram_source() -> Repo:
    seed = ENGRAM
    vocab = len(tokenizer_vocab())
    shards: dict[str, list] = {
        "model-00001-of-00048.safetensors": [
            tensor("model.embed_tokens.weight", "BF16", [vocab, HIDDEN], seed),
            tensor("model.layers.0.attn.wq_a.weight", "F8_E4M3", [HIDDEN, 64], seed),
        ],
        "model-00002-of-00048.safetensors": [tensor("model.layers.1.attn.wq_a.weight", "F8_E4M3", [HIDDEN, 64], seed)],
        "model-00046-of-00048.safetensors": [tensor("lm_head.weight", "BF16", [vocab, HIDDEN], seed)],
    }
    for k, (layer, rows) in enumerate(zip(ENGRAM_LAYERS, ENGRAM_ROWS, strict=True), start=47):
        shards[f"model-{k:05d}-of-00048.safetensors"] = [
            tensor(f"model.layers.{layer}.engram.embed.weight", "F8_E4M3", [rows, ENGRAM_HEAD_DIM], seed),
            tensor(f"model.layers.{layer}.engram.embed.scale", "F8_E8M0", [rows, ENGRAM_HEAD_DIM // 32], seed),
        ]
    quant = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
             "expert_dtype": "fp4"}
    readme = (
        "---\nlicense: mit\n---\n# DeepSeek-V4.1-Flash-1017 (simulated)\n\nTiny stand-in of the original FP8 "
        "checkpoint. Shards 47 and 48 hold the Engram tables; the other shards must not be fetched.\n"
    )
    files = [
        gitattributes(),
        RepoFile("README.md", readme.encode()),
        RepoFile("config.json", jdump(model_config(quant))),
        RepoFile("tokenizer.json", jdump(tokenizer_json())),
        RepoFile("model.safetensors.index.json", index_json(shards)),
    ]
    files += [RepoFile(n, safetensors(t)) for n, t in shards.items()]
    return make_repo(ENGRAM, files)


VERIFY_KIT = """#!/usr/bin/env bash
# Simulated kit check: compares the kit folder this script lives in with MANIFEST (sha256sum format).
# The real script's --rope/--bias remakes need torch and the original checkpoint; not supported here.
set -u
if [ $# -ne 0 ]; then
    echo "usage: verify_kit.sh   (the simulated kit takes no options)" >&2
    exit 2
fi
kit=$(cd "$(dirname "$0")/.." && pwd)
total=0
bad=0
while read -r sum path; do
    [ -n "${path:-}" ] || continue
    total=$((total + 1))
    if [ ! -f "$kit/$path" ]; then
        echo "MISSING  $path"; bad=$((bad + 1)); continue
    fi
    got=$(sha256sum "$kit/$path" | cut -d' ' -f1)
    if [ "$got" != "$sum" ]; then
        echo "DIFFERS  $path"; bad=$((bad + 1))
    fi
done < "$kit/MANIFEST"
if [ "$bad" -eq 0 ]; then
    echo "kit OK: $total files match MANIFEST"
else
    echo "kit NOT OK: $bad of $total files missing or different"
    exit 1
fi
"""


def _cubin(seed: str, n: int) -> bytes:
    # ELF64 little-endian magic, CUDA's EM (190), then filler: enough to look like a cubin to `file`.
    head = b"\x7fELF\x02\x01\x01\x33\x07" + b"\0" * 7 + struct.pack("<HH", 2, 190)
    return head + det_bytes(seed, n - len(head))


def _f32_table(seed: str, rows: int, dim: int) -> bytes:
    # Exact dyadic values (no libm), so every platform builds identical bytes.
    vals = det_ints(seed, rows * dim, 2049)
    return struct.pack(f"<{rows * dim}f", *[(v - 1024) / 1024.0 for v in vals])


def kernel_kit() -> Repo:
    kit: dict[str, bytes] = {}
    aot_kernels = []
    for name in ("fused_moe_topk", "sparse_attn_decode", "hc_side_fill"):
        blob = _cubin(f"{KIT}/aot/{name}", 1536)
        digest = hashlib.sha256(blob).hexdigest()[:16]
        kit[f"aot/cubins/{digest}.cubin"] = blob
        aot_kernels.append({"name": name, "cubin": f"cubins/{digest}.cubin", "num_warps": 4, "shared": 49152})
    kit["aot/aot.json"] = jdump({"arch": "sm_121", "runtime": "nvcr.io/nvidia/pytorch:26.07-py3",
                                 "kernels": aot_kernels})
    for name in ("linear", "linear_grouped", "experts", "experts_cb"):
        kit[f"cubins/{name}.cubin"] = _cubin(f"{KIT}/cubins/{name}", 2048)
    kit["engram.json"] = jdump({
        "layer_ids": list(ENGRAM_LAYERS),
        "max_ngram_size": 4,
        "n_heads": 8,
        "multipliers": [[v * 2 + 1 for v in det_ints(f"{KIT}/mul/{layer}", 4, 1 << 40)] for layer in ENGRAM_LAYERS],
        "buckets": [det_ints(f"{KIT}/prime/{layer}", 3 * 8, 1 << 20) for layer in ENGRAM_LAYERS],
    })
    rope_rows, plain_dim, comp_dim = 128, 16, 8
    for kind, dim in (("plain", plain_dim), ("compressed", comp_dim)):
        for fn in ("cos", "sin"):
            kit[f"rope-{kind}-{fn}.f32"] = _f32_table(f"{KIT}/rope/{kind}/{fn}", rope_rows, dim)
    kit["rope.json"] = jdump({
        "rows": rope_rows,
        "plain": {"dim": plain_dim, "theta": 10000.0, "cos": "rope-plain-cos.f32", "sin": "rope-plain-sin.f32"},
        "compressed": {"dim": comp_dim, "theta": 160000.0, "cos": "rope-compressed-cos.f32",
                       "sin": "rope-compressed-sin.f32"},
        "dtype": "float32",
        "sim_note": "tiny simulated tables (the published ones cover 1048576 rows)",
    })
    kit["vision/torch_fmha_sm120.cubin"] = _cubin(f"{KIT}/vision/fmha", 1024)
    kit["vision/gate_bias_vl.safetensors"] = safetensors(
        [tensor(f"vision.gate_bias.{i}", "F32", [4], f"{KIT}/vision") for i in range(43)]
    )
    kit["README.md"] = (
        b"# TensorFold TP2 kernel kit (simulated)\n\nCopy this folder whole and unchanged; check it with "
        b"`bash tools/verify_kit.sh` (sha256 of every file against MANIFEST).\n"
    )
    kit["KIT-LICENSES.md"] = b"# Licenses\n\nSimulated kit: generated test bytes, no third-party content.\n"
    kit["tools/verify_kit.sh"] = VERIFY_KIT.encode()
    manifest = "".join(f"{hashlib.sha256(kit[p]).hexdigest()}  {p}\n" for p in sorted(kit))
    files = [gitattributes(), RepoFile("README.md", (
        b"# DeepSeek-V4.1-Flash TensorFold TP2 on 2x GB10 (simulated)\n\nThe kernel kit is the `kit/` folder: "
        b"download it whole (`--include 'kit/*'`) and run `kit/tools/verify_kit.sh`.\n"))]
    files += [RepoFile(f"kit/{p}", kit[p]) for p in sorted(kit)]
    files.append(RepoFile("kit/MANIFEST", manifest.encode()))
    return make_repo(KIT, files)


APPLY_SCRIPT = r'''#!/usr/bin/env python3
"""Apply the Keys overlay (attn.wo_b of layers 10-35) to a copy of a 2.9 bpw EXL3 pack (simulated version).

Usage: apply_mia_exl3_wob.py --src PACK_DIR --wo-b OVERLAY.safetensors --dst NEW_DIR
Every file of --src is hard-linked (copied across filesystems) into --dst, except the shards holding the wanted
tensors, which are rewritten with the overlay's bytes. --src is never modified.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

WANTED = re.compile(r"(?:model\.)?layers\.(\d+)\.attn\.wo_b\.(trellis|suh|svh|mul1)")


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def fail(msg):
    print(f"apply_mia_exl3_wob: {msg}", file=sys.stderr)
    sys.exit(1)


def place(src, dst):
    if os.path.lexists(dst):
        os.unlink(dst)
    try:
        os.link(os.path.realpath(src), dst)
    except OSError:
        shutil.copyfile(src, dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--wo-b", required=True, dest="wo_b")
    ap.add_argument("--dst", required=True)
    a = ap.parse_args()
    src, dst = os.path.realpath(a.src), os.path.realpath(a.dst)
    if src == dst or dst.startswith(src + os.sep):
        fail("--dst must be a new directory outside --src (the stock pack stays untouched)")
    index_path = os.path.join(src, "model.safetensors.index.json")
    if not os.path.isfile(index_path):
        fail(f"{src} has no model.safetensors.index.json")
    with open(index_path) as f:
        weight_map = json.load(f)["weight_map"]
    wanted = {}
    for name, shard in weight_map.items():
        m = WANTED.fullmatch(name)
        if m and 10 <= int(m.group(1)) <= 35:
            wanted.setdefault(shard, []).append(name)
    if not wanted:
        fail("the pack has no layers.10-35 attn.wo_b tensors")
    overlay, overlay_base = read_header(a.wo_b)
    missing = [n for names in wanted.values() for n in names if n not in overlay]
    if missing:
        fail(f"the overlay lacks {len(missing)} wanted tensors, e.g. {missing[0]}")
    with open(a.wo_b, "rb") as f:
        overlay_bytes = f.read()
    os.makedirs(dst, exist_ok=True)
    replaced = 0
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d != ".cache")
        rel = os.path.relpath(root, src)
        out_dir = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(out_dir, exist_ok=True)
        for name in sorted(files):
            rel_name = name if rel == "." else os.path.join(rel, name)
            if rel_name not in wanted:
                place(os.path.join(root, name), os.path.join(out_dir, name))
                continue
            header, base = read_header(os.path.join(root, name))
            with open(os.path.join(root, name), "rb") as f:
                data = bytearray(f.read())
            for t in wanted[rel_name]:
                mine, theirs = header[t], overlay[t]
                if (mine["dtype"], mine["shape"]) != (theirs["dtype"], theirs["shape"]):
                    fail(f"{t}: overlay {theirs['dtype']}{theirs['shape']} != pack {mine['dtype']}{mine['shape']}")
                b, e = mine["data_offsets"]
                ob, oe = theirs["data_offsets"]
                data[base + b:base + e] = overlay_bytes[overlay_base + ob:overlay_base + oe]
                replaced += 1
            tmp = os.path.join(out_dir, f".{name}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            if os.path.lexists(os.path.join(out_dir, name)):
                os.unlink(os.path.join(out_dir, name))
            os.rename(tmp, os.path.join(out_dir, name))
    print(f"applied {replaced} tensors in {len(wanted)} shards: {dst}")


if __name__ == "__main__":
    main()
'''


def ablit_overlay() -> Repo:
    seed = ABLIT
    overlay = [tensor(wo_b_name(layer, part), dtype, shape, seed)
               for layer in ABLIT_LAYERS for part, (dtype, shape) in WO_B_PARTS.items()]
    fp8 = [tensor(f"model.layers.{layer}.attn.wo_b.weight", "F8_E4M3", [16, 16], seed) for layer in ABLIT_LAYERS]
    readme = (
        "---\nlicense: mit\nextra_gated_prompt: Agree to use this overlay responsibly.\n---\n"
        "# Keys overlay (simulated, gated)\n\n`mia_exl3_wo_b_l10_35.safetensors` replaces layers 10-35 attn.wo_b of "
        "the EXL3 2.9 bpw pack: `python3 apply_mia_exl3_wob.py --src PACK --wo-b mia_exl3_wo_b_l10_35.safetensors "
        "--dst NEW`. `wo_b_l10_35.safetensors` is the FP8 variant for other packs: do not use it here.\n"
    )
    files = [
        gitattributes(),
        RepoFile("README.md", readme.encode()),
        RepoFile("apply_mia_exl3_wob.py", APPLY_SCRIPT.encode()),
        RepoFile("mia_exl3_wo_b_l10_35.safetensors", safetensors(overlay, {"format": "pt", "overlay": "keys"})),
        RepoFile("wo_b_l10_35.safetensors", safetensors(fp8)),
    ]
    return make_repo(ABLIT, files, gated=True)


def make_repo(repo_id: str, files: list[RepoFile], gated: bool = False) -> Repo:
    return Repo(repo_id, COMMITS[repo_id], {f.path: f for f in files}, gated=gated)


_CACHE: dict[str, Repo] | None = None


def build_repos() -> dict[str, Repo]:
    """repo id -> Repo (built once per process)."""
    global _CACHE
    if _CACHE is None:
        repos = [eaq_pack(EAQ_V1, "1"), eaq_pack(EAQ_V1_1, "1.1"), engram_source(), kernel_kit(), ablit_overlay()]
        _CACHE = {r.repo_id: r for r in repos}
    return _CACHE


def catalog() -> dict[str, dict]:
    """What each served repo holds: {repo: {"commit", "gated", "files": {path: size}, "sha256": {path: hex}}}."""
    return {
        rid: {
            "commit": r.commit,
            "gated": r.gated,
            "files": {p: f.size for p, f in r.files.items()},
            "sha256": {p: f.sha256 for p, f in r.files.items()},
        }
        for rid, r in build_repos().items()
    }


if __name__ == "__main__":
    print(json.dumps(catalog(), indent=2))
