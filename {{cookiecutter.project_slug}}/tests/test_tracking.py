"""Run folders and wandb modes: the engine-neutral parts of config.py and tracking.py."""

import subprocess
import sys
import time

from {{ cookiecutter.package_name }}.config import run_stamp
from {{ cookiecutter.package_name }}.tracking import wandb_mode


def test_run_folders_are_shared_by_torchrun_ranks(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    assert run_stamp() == "torchrun-abc123"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert run_stamp()[:2] == "20"


def test_processes_of_one_accelerate_launch_share_a_run_folder(monkeypatch):
    """accelerate launch sets no run id; its processes may start in different seconds."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    stamp = "from {{ cookiecutter.package_name }}.config import run_stamp; print(run_stamp())"
    first = subprocess.run([sys.executable, "-c", stamp], capture_output=True, text=True, check=True).stdout
    time.sleep(1.1)
    second = subprocess.run([sys.executable, "-c", stamp], capture_output=True, text=True, check=True).stdout
    assert first == second and first.startswith("20")


def test_wandb_goes_offline_without_credentials_and_obeys_wandb_mode(monkeypatch, tmp_path):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_mode() == "offline", "no key, no netrc file"
    netrc.write_text("machine example.com login user password secret\n")
    assert wandb_mode() == "offline", "a netrc without wandb's host"
    netrc.write_text("machine api.wandb.ai login user password secret\n")
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled", "WANDB_MODE always wins"
    monkeypatch.delenv("WANDB_MODE")
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
