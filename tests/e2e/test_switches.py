"""The serving switches on the simulated pair: SPARKFOLD_API_KEY (a generated key and your own api_key_file), ABLIT
and EAQ_V1_1, each on and back off.

Each test starts from a converged pair (converged_pair) and leaves one.
"""

from __future__ import annotations

import json
import time

import pytest
import requests
from test_deploy import API, NAME, changed_ops, chat, deploy, failing_deploy, pair_ids

KEY_FILE = "/home/nvidia/.local/state/sparkfold/api-key.d/key"

pytestmark = pytest.mark.usefixtures("converged_pair")


def rank0_args(sim_exec) -> str:
    return sim_exec("head", ["docker", "inspect", "-f", "{{json .Args}} {{json .Mounts}}", NAME]).stdout


def test_api_key_on_then_off(run_pyinfra, sim_exec):
    run = deploy(run_pyinfra, env={"SPARKFOLD_API_KEY": "1"})
    key = sim_exec("head", ["cat", KEY_FILE]).stdout.strip()
    assert len(key) == 64
    assert sim_exec("head", ["stat", "-c", "%a %U", KEY_FILE]).stdout.split() == ["600", "nvidia"]
    assert KEY_FILE in run.stderr and key not in run.stderr and key not in run.stdout
    assert "--api-key-file" in rank0_args(sim_exec)
    assert requests.get(f"{API}/v1/models", timeout=10).status_code == 401
    ok = requests.get(f"{API}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "DeepSeek-V4.1-Flash-1017"
    # converged with the key: nothing changes, the key stays; even pyinfra's -vvv (every command and its output)
    # and the rank's docker inspect never show it
    loud = deploy(run_pyinfra, "-vvv", env={"SPARKFOLD_API_KEY": "1"})
    assert changed_ops(loud) == {}
    assert key not in loud.stderr and key not in loud.stdout and "docker" in loud.stderr  # -vvv did echo commands
    assert key not in sim_exec("head", ["docker", "inspect", NAME]).stdout
    assert sim_exec("head", ["cat", KEY_FILE]).stdout.strip() == key
    # rotation: a new file renamed over the old one reaches the running rank 0 (no restart), the old key stops
    before = pair_ids(sim_exec)
    run = deploy(run_pyinfra, "--data", "rotate_api_key=true", env={"SPARKFOLD_API_KEY": "1"})
    new = sim_exec("head", ["cat", KEY_FILE]).stdout.strip()
    assert len(new) == 64 and new != key and new not in run.stderr + run.stdout
    assert pair_ids(sim_exec) == before
    time.sleep(1.5)  # the engine checks the file's mtime at most once a second
    assert requests.get(f"{API}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 401
    assert requests.get(f"{API}/v1/models", headers={"Authorization": f"Bearer {new}"}, timeout=10).status_code == 200
    # off again: the pair is recreated without the key and the API is open
    deploy(run_pyinfra)
    assert "--api-key-file" not in rank0_args(sim_exec)
    assert requests.get(f"{API}/v1/models", timeout=10).status_code == 200


def test_your_own_api_key_file(run_pyinfra, sim_exec, tmp_path):
    """api_key_file: the key in a file on this machine becomes rank 0's key, uploaded, never printed; a converged
    run changes nothing; a new key in the file replaces it without a restart; an empty file is refused first."""
    key_file = tmp_path / "my-key"
    mine = "sim-own-key-0123456789abcdef"
    key_file.write_text(mine + "\n")
    env = {"SPARKFOLD_API_KEY": "1", "SPARKFOLD_API_KEY_FILE": str(key_file)}
    run = deploy(run_pyinfra, env=env)
    assert sim_exec("head", ["cat", KEY_FILE]).stdout == mine + "\n"
    assert sim_exec("head", ["stat", "-c", "%a %U", KEY_FILE]).stdout.split() == ["600", "nvidia"]
    assert mine not in run.stderr + run.stdout
    assert requests.get(f"{API}/v1/models", headers={"Authorization": f"Bearer {mine}"}, timeout=10).status_code == 200
    loud = deploy(run_pyinfra, "-vvv", env=env)
    assert changed_ops(loud) == {} and mine not in loud.stderr + loud.stdout
    before = pair_ids(sim_exec)
    key_file.write_text("sim-own-key-second-0123456789\n")
    run = deploy(run_pyinfra, env=env)
    assert list(changed_ops(run)) == [f"The API key | API key from api_key_file in {KEY_FILE} (head only)"]
    assert pair_ids(sim_exec) == before
    time.sleep(1.5)  # the engine checks the file's mtime at most once a second
    assert requests.get(f"{API}/v1/models", headers={"Authorization": f"Bearer {mine}"}, timeout=10).status_code == 401
    assert requests.get(f"{API}/v1/models", headers={"Authorization": "Bearer sim-own-key-second-0123456789"},
                        timeout=10).status_code == 200
    key_file.write_text("")
    refused = failing_deploy(run_pyinfra, env=env)
    assert f"api_key_file = '{key_file}' is empty" in refused.stderr and changed_ops(refused) == {}
    deploy(run_pyinfra)  # off again: the API is open
    assert requests.get(f"{API}/v1/models", timeout=10).status_code == 200


def test_ablit_with_a_token_serves_the_overlay_and_back_without_a_download(run_pyinfra, sim_exec):
    # the stock blobs' bytes (their link counts change: the applied pack hard-links them)
    blobs = "cd /home/nvidia/.cache/huggingface/hub/models--Mia-AiLab--DeepSeek-V4.1-Flash-1017-EXL3-EAQ-v1-2.9-bpw" \
            " && sha256sum blobs/*"
    stock_blobs = sim_exec("head", blobs).stdout
    assert stock_blobs.count("blobs/") >= 3
    # from a head that never had the overlay: a token without gated access stops the run
    assert sim_exec("head", "rm -rf /home/nvidia/.cache/sparkfold/ablit /home/nvidia/.cache/sparkfold/ablit-overlay"
                    ).returncode == 0
    failing = failing_deploy(run_pyinfra, env={"ABLIT": "1", "HF_TOKEN": "hf_wrongtoken"})
    assert "ABLIT overlay" in failing.stderr or "403" in failing.stderr or "token" in failing.stderr.lower()
    run = deploy(run_pyinfra, env={"ABLIT": "1", "HF_TOKEN": "hf_simtoken"})
    changed = changed_ops(run)
    assert any(name.startswith("The model data | ABLIT overlay") for name in changed), changed
    assert "/ablit" in rank0_args(sim_exec)
    assert chat()["choices"][0]["message"]["content"]
    # back to stock: no checkpoint download, the stock blobs untouched, the stock snapshot served again
    run = deploy(run_pyinfra)
    assert not any(name.startswith("The model data | Checkpoint: fetch") for name in changed_ops(run)), changed_ops(run)
    assert "/ablit" not in rank0_args(sim_exec)
    assert sim_exec("head", blobs).stdout == stock_blobs


def test_eaq_v1_1_switches_the_pack_and_back(run_pyinfra, sim_exec):
    before = pair_ids(sim_exec)
    run = deploy(run_pyinfra, env={"EAQ_V1_1": "1"})
    assert any(name.startswith("The model data | Checkpoint: fetch") and "v1.1" in name
               for name in changed_ops(run)), changed_ops(run)
    assert "EAQ-v1.1-2.9-bpw" in rank0_args(sim_exec)
    worker_args = sim_exec("worker", ["docker", "inspect", "-f", "{{json .Args}}", NAME]).stdout
    assert "EAQ-v1.1-2.9-bpw" in worker_args
    assert pair_ids(sim_exec) != before
    assert chat()["choices"][0]["message"]["content"]
    run = deploy(run_pyinfra)
    assert not any(name.startswith("The model data | Checkpoint: fetch") for name in changed_ops(run)), changed_ops(run)
    assert "EAQ-v1.1-2.9-bpw" not in rank0_args(sim_exec)
    assert json.loads(requests.get(f"{API}/v1/models", timeout=10).text)["data"]
