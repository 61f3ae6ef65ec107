#!/bin/bash
# Train over 2 machines with torchrun (c10d rendezvous). Run this on EACH machine, with the same arguments:
#   launch/torchrun_multinode.sh HEAD_HOST RUN_ID [overrides]
# HEAD_HOST: an address of one of the machines that all can reach (its port 29500 must be open);
# RUN_ID: names the training; its run folder is outputs/<experiment>/RUN_ID (put outputs/ on a filesystem that
# every machine sees). Started again with the same RUN_ID, the training continues from its last checkpoint.
# A process that dies makes torchrun restart all of them (up to --max-restarts times); they resume from the last
# checkpoint. Processes per machine: NPROC_PER_NODE, else one per GPU (one on a machine without GPUs).
set -euo pipefail
head_host=$1 run_id=$2
shift 2
nproc=${NPROC_PER_NODE:-$(python -c 'import torch; print(torch.cuda.device_count())')}
if [ "$nproc" = 0 ]; then
  echo "no GPU on this machine: 1 training process here (set NPROC_PER_NODE=N for N)"
  nproc=1
fi

# First the checks a training makes before it starts, in one process that sees the layout torchrun will give
# the first: a refused command stops here with its one error line. (torchrun would start it again, up to
# --max-restarts times, then end in a traceback of its own.)
WORLD_SIZE=$((2 * nproc)) LOCAL_WORLD_SIZE=$nproc GROUP_WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 GROUP_RANK=0 \
  TORCHELASTIC_RUN_ID=$run_id python -m {{ cookiecutter.package_name }}.train strategy=ddp "$@" check_only=true

# Each restart meets in a new store: in the one torchrun shares with its workers by default, a restarted worker
# can find a dead one's address and hang (torch 2.13; see warn_if_restarts_can_hang in launcher.py).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec torchrun \
  --nnodes=2 \
  --nproc-per-node="$nproc" \
  --rdzv-backend=c10d \
  --rdzv-endpoint="$head_host:29500" \
  --rdzv-id="$run_id" \
  --max-restarts=3 \
  -m {{ cookiecutter.package_name }}.train strategy=ddp "$@"
