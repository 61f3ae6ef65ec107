"""Run ids, wandb modes, wandb runs that survive restarts: the engine-neutral parts of launcher.py and tracking.py."""

import json
import os
import struct
import subprocess
import sys
import time

from wandb.proto import wandb_internal_pb2

from {{ cookiecutter.package_name }}.parallel.launcher import default_run_id
from {{ cookiecutter.package_name }}.tracking.wandb_files import STEP, logged_steps
from {{ cookiecutter.package_name }}.tracking.wandb_run import keep_wandb_run_id, wandb_mode, wandb_run_id

LAUNCHER_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE")


def test_run_id_is_the_slurm_job_then_the_torchrun_rendezvous_then_the_time(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    assert default_run_id()[:2] == "20"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id
    assert default_run_id()[:2] == "20"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    assert default_run_id() == "abc123"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert default_run_id() == "77"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert default_run_id() == "70_3"


def test_a_run_id_resolved_again_later_in_the_same_process_is_the_same(monkeypatch):
    """Lightning's launcher resolves the run folder again when it starts ddp's other processes: a second later, a
    timestamp of the call's moment named another (empty) folder."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    first = default_run_id()
    now, later = time.localtime, time.time() + 5  # the clock 5 s on
    monkeypatch.setattr(time, "localtime", lambda seconds=None: now(later if seconds is None else seconds))
    assert default_run_id() == first


def test_processes_of_one_accelerate_launch_share_a_run_folder(monkeypatch):
    """accelerate launch sets no run id; its processes may start in different seconds."""
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    stamp = "from {{ cookiecutter.package_name }}.parallel.launcher import default_run_id; print(default_run_id())"
    first = subprocess.run([sys.executable, "-c", stamp], capture_output=True, text=True, check=True).stdout
    time.sleep(1.1)
    second = subprocess.run([sys.executable, "-c", stamp], capture_output=True, text=True, check=True).stdout
    assert first == second and first.startswith("20")


def run_file(path, rows) -> None:
    """A wandb run file (`run-<id>.wandb`) holding these history rows, as wandb's service writes one."""
    data = b":W&B" + struct.pack("<HB", 0xBEE1, 0)  # magic and version
    for row in rows:
        record = wandb_internal_pb2.Record()
        for key, value in row.items():
            item = record.history.item.add()
            item.key, item.value_json = key, json.dumps(value)
        payload = record.SerializeToString()
        data += struct.pack("<IHB", 0, len(payload), 1) + payload  # (checksum unread), length, a whole record
    path.parent.mkdir(parents=True)
    path.write_bytes(data)


def test_the_starts_of_a_run_within_one_second_are_all_read(tmp_path):
    """wandb names a second start that begins in the second of the first `...-<id>-1/`: that folder was left out,
    and the next start logged the second's steps to wandb again (a test that failed under load)."""
    run_file(tmp_path / "wandb" / "offline-run-20261130_172033-abc/run-abc.wandb", [{STEP: 3, "train/loss": 1.0}])
    run_file(tmp_path / "wandb" / "offline-run-20261130_172033-abc-1/run-abc.wandb", [{STEP: 9, "train/loss": 0.5}])
    run_file(tmp_path / "wandb" / "offline-run-20261130_172033-xyz/run-xyz.wandb", [{STEP: 12, "train/loss": 0.1}])
    assert logged_steps(tmp_path, "abc") == {"train/loss": 9}


def test_a_restart_keeps_the_wandb_run_id(tmp_path):
    first = wandb_run_id(tmp_path)
    assert wandb_run_id(tmp_path) != first, "nothing kept yet: a run refused before training leaves no file"
    keep_wandb_run_id(tmp_path, first)
    assert wandb_run_id(tmp_path) == first
    keep_wandb_run_id(tmp_path, "other")
    assert wandb_run_id(tmp_path) == first, "the first start's id stays"


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


def test_wandb_started_without_home_keeps_its_own_logs_off_the_terminal(tmp_path):
    """A bare environment (no HOME: a container's, a batch system's) made wandb's service print some 20 lines of its
    own logs around the training's output; wandb_mode(), which every start of wandb calls, gives it a cache."""
    start = (
        "import wandb; from {{ cookiecutter.package_name }}.tracking.wandb_run import wandb_mode; "
        f"wandb.init(mode=wandb_mode(), dir={str(tmp_path)!r}, project='p'); wandb.finish()"
    )
    bare = {name: value for name, value in os.environ.items() if name not in ("HOME", "XDG_CACHE_HOME")}
    started = subprocess.run(
        [sys.executable, "-c", start], env={**bare, "WANDB_MODE": "offline", "TMPDIR": str(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert " INFO " not in started.stderr and " ERROR " not in started.stderr, started.stderr
