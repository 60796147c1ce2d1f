#!/usr/bin/env bash
# The main job: bring the example SlurmCluster up in the sandbox (real Slurm
# of the example's release, each pod under runc from the images built from
# images/; no Docker, no kube-apiserver), then do
# what a researcher does: SSH to the login pod, put an unchanged sbatch script
# on shared storage, submit it, and read its output. Then the node-lending
# story (hack/demo_lending.py): idle Kubernetes GPU nodes are lent to Slurm,
# train.sh runs across them, a serving Deployment takes one back, the job
# checkpoints, the serving pod serves that checkpoint, and the job resumes.
# A Prometheus (examples/monitoring/) watches it all, and the last lines are
# what it saw: GPU-hours lent, lend and reclaim latency, queue wait.
#
#   hack/demo.sh [MANIFEST]        default: examples/slurmcluster.yaml
#
# Needs root on Debian bookworm; installs what it needs first (hack/setup.sh).
# The cluster keeps running afterwards; the last lines say how to go on.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh
t_setup=$SECONDS
example=${1:-examples/slurmcluster.yaml}
script=examples/train.sh
sk=.venv/bin/slurmk8s

say() { printf '\n== %s\n' "$*"; }
on_login() { "$sk" sandbox ssh -- "$@"; }
field() { "$sk" sandbox status -o json | .venv/bin/python -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

say "Validating $example"
"$sk" validate -f "$example"

say "Bringing the cluster up in the sandbox"
"$sk" sandbox up -f "$example"
t_up=$SECONDS
"$sk" sandbox status

say "Installing Prometheus as a site would (examples/monitoring/prometheus.yaml)"
.venv/bin/python hack/demo_metrics.py install

user=$(field 'd["login"]["user"]')
dir=$(field 'd["sharedStorage"]["mountPath"]')/$user/demo
ckpt=$(field 'd["sharedStorage"]["checkpointDir"]')/$user/train
say "As $user on the login pod: copying $script to $dir and submitting it"
# A fresh start: the script resumes from the checkpoint an earlier run left.
on_login "rm -rf $ckpt && mkdir -p $dir && cat > $dir/train.sh && chmod +x $dir/train.sh" <"$script"
job=$(on_login "cd $dir && sbatch --parsable train.sh")
job=${job%%;*}
echo "Submitted batch job $job"

start=$SECONDS last=
while :; do
  state=$(on_login "scontrol show job $job" | tr ' ' '\n' | sed -n 's/^JobState=//p')
  if [ "$state" != "$last" ]; then
    printf '  %3ds  job %s is %s\n' $((SECONDS - start)) "$job" "$state"
    last=$state
  fi
  case $state in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;;
  esac
  if [ $((SECONDS - start)) -ge 300 ]; then
    echo "job $job is still $state after 300s; see: $sk sandbox ssh -- scontrol show job $job" >&2
    exit 1
  fi
  sleep 1
done

say "Output of job $job ($dir/train-$job.out)"
on_login "cat $dir/train-$job.out"
[ "$state" = COMPLETED ] || { echo "job $job ended $state" >&2; exit 1; }

say "Published model versions in $ckpt (LATEST names the newest; examples/serving.yaml serves it)"
on_login "ls $ckpt && echo LATEST: \$(cat $ckpt/LATEST)"

# Act 2: lend idle GPU nodes, train on them, take one back for serving, resume.
.venv/bin/python hack/demo_lending.py

say "What Prometheus saw (the dashboards: charts/slurmk8s/files/dashboards/, docs/metrics.md)"
.venv/bin/python hack/demo_metrics.py report

say "The demo took $SECONDS s: setup ${t_setup} s, sandbox up $((t_up - t_setup)) s (its images: the lines \"images: ... built in\" above), the story $((SECONDS - t_up)) s"

say "The cluster is still running. Next:"
cat <<NEXT
  $sk sandbox ssh                  a shell on the login pod as $user (sinfo, sbatch, squeue, srun)
  $sk sandbox ssh -- sinfo         one command
  $sk sandbox status               pods, addresses, Slurm node states, the kubeconfig
  .venv/bin/kubectl --kubeconfig $("$sk" sandbox status -o json | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["kubeconfig"])') get slurmclusters,pods
  $sk sandbox logs POD             a pod's log
  $sk sandbox down                 stop everything (--purge also deletes the objects and storage)
NEXT
