#!/bin/bash
# Train on several machines with torchrun, without a scheduler. Run the same command on every machine, from
# the project root, with the first machine's address (reachable from all) as HEAD:
#
#   HEAD=node0:29500 NNODES=2 NPROC_PER_NODE=4 RUN_ID=my-run launch/torchrun_multinode.sh strategy=ddp
#
# The machines meet at HEAD (c10d rendezvous) under RUN_ID, which also names the run folder
# (outputs/<experiment>/<...RUN_ID>, on a filesystem the machines share). A crashed process makes torchrun
# restart the group, up to MAX_RESTARTS times; running the same command again after the whole job stopped
# continues from the last checkpoint too. (Under SLURM, use launch/slurm.sbatch.)
set -euo pipefail

: "${HEAD:?set HEAD=<first machine>:<port>}"
: "${RUN_ID:?set RUN_ID=<a name for this training>, the same on every machine}"

# Each restart meets in a new store: in the one torchrun shares with its workers by default, a restarted worker
# can find a dead one's address and hang (torch 2.13; see warn_if_restarts_can_hang in launcher.py).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec python -m torch.distributed.run \
  --nnodes="${NNODES:-2}" --nproc-per-node="${NPROC_PER_NODE:-gpu}" \
  --rdzv-backend=c10d --rdzv-endpoint="$HEAD" --rdzv-id="$RUN_ID" \
  --max-restarts="${MAX_RESTARTS:-3}" \
  -m {{ cookiecutter.package_name }}.train "$@"
