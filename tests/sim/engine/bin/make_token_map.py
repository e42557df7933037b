#!/usr/bin/env python3
"""Stand-in for tools/dsv41-zig/inputs/make_token_map.py: MODEL_DIR OUT_JSON.

Maps every token id of tokenizer.json's vocab to a compressed id; tokens whose text normalizes alike (NFKC, NFD,
accents stripped, lower case, whitespace collapsed) share one; a token that decodes to a partial
UTF-8 character keys by its token string. Writes the map as a JSON list."""

import json
import os
import re
import sys
import unicodedata


def normalize(text):
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(c for c in text if unicodedata.category(c) != "Mn").lower()
    text = re.sub(r"[ \t\r\n]+", " ", text)
    return " " if text == " " else text.strip()


def byte_decoder():
    """The byte-level BPE alphabet (printable stand-ins for the 256 bytes), reversed: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def decode(token, added, table):
    """A token's text the way the tokenizer decodes it alone (added tokens are kept as written)."""
    if token in added:
        return token
    try:
        return bytes(table[c] for c in token).decode("utf-8", errors="replace")
    except KeyError:
        return token


def main(argv):
    if len(argv) != 2:
        print("usage: make_token_map.py MODEL_DIR OUT_JSON", file=sys.stderr)
        return 2
    model, out = argv
    with open(os.path.join(model, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    added = {t.get("content") for t in tokenizer.get("added_tokens") or []}
    table = byte_decoder()
    if isinstance(vocab, list):  # unigram vocabularies are [token, score] lists
        vocab = {entry[0]: i for i, entry in enumerate(vocab)}
    size = max(vocab.values()) + 1 if vocab else 0
    keys = [None] * size
    for token, tid in vocab.items():
        text = decode(token, added, table)
        keys[tid] = token if "\ufffd" in text else (normalize(text) or text)
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
