"""The stand-in engine's make_token_map.py and the fake Hub's config agree on Engram's compressed vocabulary."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sim" / "fakehub"))

import repos  # noqa: E402


def test_standin_token_map_matches_the_fake_checkpoint(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(repos.tokenizer_json()))
    (tmp_path / "config.json").write_text(json.dumps({"engram_compressed_vocab_size": repos.compressed_vocab_size()}))
    out = tmp_path / "map.json"
    run = subprocess.run([sys.executable, str(ROOT / "tests/sim/engine/bin/make_token_map.py"),
                          str(tmp_path), str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text()) == repos.compressed_token_map()


def test_standin_token_map_refuses_a_wrong_vocab_size(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(repos.tokenizer_json()))
    (tmp_path / "config.json").write_text(json.dumps({"engram_compressed_vocab_size": 5}))
    run = subprocess.run([sys.executable, str(ROOT / "tests/sim/engine/bin/make_token_map.py"), str(tmp_path),
                          str(tmp_path / "m.json")], capture_output=True, text=True)
    assert run.returncode == 1 and "engram_compressed_vocab_size is 5" in run.stderr
