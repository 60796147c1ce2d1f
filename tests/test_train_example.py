"""examples/train.sh outside Slurm (scontrol and srun stand-ins): it resumes
from the version LATEST names and publishes each checkpoint atomically."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from .apiserver.conftest import wait_for
from .conftest import publish

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples/train.sh"


def test_it_publishes_versions_and_keeps_the_three_newest(tmp_path, fake_slurm):
    model_dir = tmp_path / "ckpt"
    for step in (1, 2, 3):
        publish(model_dir, f"step-{step:06d}", step)
    job = {**fake_slurm, "SLURMK8S_CHECKPOINT_DIR": str(model_dir), "TRAIN_STEPS": "6"}
    out = subprocess.run(["bash", str(TRAIN)], env=job, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "step 3 of 6" in out and "done: 6 steps; model version step-000006" in out
    assert sorted(p.name for p in model_dir.iterdir()) == ["LATEST", "step-000003", "step-000005", "step-000006"]
    assert (model_dir / "LATEST").read_text() == "step-000006\n"
    assert (model_dir / "step-000006/step").read_text() == "6\n"
    assert (model_dir / "step-000006").stat().st_mode & 0o777 == 0o755  # readable by the serving pods


def test_it_falls_back_to_the_path_it_builds_itself(tmp_path, fake_slurm):
    job = {**fake_slurm, "TRAIN_STEPS": "0"}
    out = subprocess.run(["bash", "-c", f"sed 's|/shared/checkpoints|{tmp_path}|' {TRAIN} | bash"], env=job,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"in {tmp_path}/researcher/train" in out
    assert (tmp_path / "researcher/train/LATEST").read_text() == "step-000000\n"


def test_it_checkpoints_on_usr1_and_requeues(tmp_path, fake_slurm):
    model_dir = tmp_path / "ckpt"
    job = {**fake_slurm, "SLURMK8S_CHECKPOINT_DIR": str(model_dir), "TRAIN_STEPS": "1000"}
    train = subprocess.Popen(["bash", str(TRAIN)], env=job, stdout=subprocess.PIPE, text=True)
    wait_for("a first checkpoint", lambda: (model_dir / "LATEST").exists())  # step 5 after 2.5 s
    train.send_signal(signal.SIGUSR1)
    out, _ = train.communicate(timeout=10)
    assert train.returncode == 0
    step = int(out.split("USR1: checkpoint at step ")[1].split(";")[0])
    assert (model_dir / "LATEST").read_text() == f"step-{step:06d}\n"
    assert (model_dir / f"step-{step:06d}" / "step").read_text() == f"{step}\n"
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]  # nothing half-written left

