#!/bin/bash
#SBATCH --job-name=ckpt
#SBATCH --requeue
#SBATCH --time=2
#SBATCH --signal=B:USR1@60
#SBATCH --open-mode=append
#SBATCH --output=ckpt-%j.out
# A training loop that checkpoints on USR1, requeues itself, and resumes.
# Slurm sends the signal 60 to 90 s before the limit (it checks every 30 s).
# The TaskProlog gives it SLURMK8S_CHECKPOINT_DIR, the same after the requeue.
ckpt=${SLURMK8S_CHECKPOINT_DIR:?the TaskProlog did not set SLURMK8S_CHECKPOINT_DIR}
step=$(cat "$ckpt/step" 2>/dev/null || echo 0)
echo "start restart=${SLURM_RESTART_COUNT:-0} step=$step dir=$ckpt"
save_and_requeue() {
  echo "$step" > "$ckpt/step"
  echo "checkpoint step=$step"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
trap save_and_requeue USR1
while [ "$step" -lt 1000000 ]; do
  step=$((step + 1))
  if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ "$step" -ge $(( $(cat "$ckpt/step") + 5 )) ]; then
    echo "done step=$step"
    exit 0
  fi
  sleep 0.2 & wait $!
done
