#!/usr/bin/env python3
"""Stand-in for tools/dsv41-zig/inputs/make_token_map.py: MODEL_DIR OUT_JSON.

Maps every token id of tokenizer.json's vocab to a compressed id; tokens whose text normalizes alike (NFKC, NFD,
accents stripped, lower case, whitespace collapsed) share one. Writes the map as a JSON list."""

import json
import os
import re
import sys
import unicodedata


def normalize(text):
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return re.sub(r"\s+", " ", text).strip()


def main(argv):
    if len(argv) != 2:
        print("usage: make_token_map.py MODEL_DIR OUT_JSON", file=sys.stderr)
        return 2
    model, out = argv
    with open(os.path.join(model, "tokenizer.json")) as f:
        vocab = (json.load(f).get("model") or {}).get("vocab") or {}
    if isinstance(vocab, list):  # unigram vocabularies are [token, score] lists
        vocab = {entry[0]: i for i, entry in enumerate(vocab)}
    size = max(vocab.values()) + 1 if vocab else 0
    keys = [None] * size
    for token, tid in vocab.items():
        text = token.replace("\u0120", " ").replace("\u010a", "\n").replace("\u2581", " ")
        keys[tid] = token if "\ufffd" in text else normalize(text)
    compressed, mapping = {}, []
    for key in keys:
        mapping.append(compressed.setdefault(key, len(compressed)))
    try:
        with open(os.path.join(model, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        config = {}
    want = config.get("engram_compressed_vocab_size") or (config.get("text_config") or {}).get(
        "engram_compressed_vocab_size")
    if want is not None and want != len(compressed):
        print(f"{model}: {len(compressed)} compressed ids but engram_compressed_vocab_size is {want}",
              file=sys.stderr)
        return 1
    with open(out, "w") as f:
        f.write(json.dumps(mapping))
    print(f"{out}: {size} token ids -> {len(compressed)} compressed ids")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
