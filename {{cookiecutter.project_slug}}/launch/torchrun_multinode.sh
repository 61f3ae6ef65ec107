#!/bin/bash
# Train on several machines with torchrun, without a scheduler. Run the same command on every machine, from
# the project root, with the first machine's address (reachable from all) as HEAD:
#
#   HEAD=node0:29500 NNODES=2 NPROC_PER_NODE=4 RUN_ID=my-run launch/torchrun_multinode.sh strategy=ddp
#
# The machines meet at HEAD (c10d rendezvous) under RUN_ID, which also names the run folder
# (outputs/<experiment>/<...RUN_ID>, on a filesystem the machines share). A crashed process makes torchrun
# restart the group, up to MAX_RESTARTS times; running the same command again after the whole job stopped
# continues from the last checkpoint too. NPROC_PER_NODE: training processes per machine (default: one per GPU,
# one on a machine without GPUs). (Under SLURM, use launch/slurm.sbatch.)
set -euo pipefail

: "${HEAD:?set HEAD=<first machine>:<port>}"
: "${RUN_ID:?set RUN_ID=<a name for this training>, the same on every machine}"
# torchrun takes a HEAD without a port (then its default, 29400, which machines given a port never reach) or a
# machine that does not resolve, and waits: refused here, in one line.
case "$HEAD" in
  *:[0-9]*) ;;
  *) echo "error: HEAD=$HEAD has no port: give HEAD=<first machine>:<port>, e.g. node0:29500" >&2; exit 2 ;;
esac
head_host=${HEAD%:*}
head_host=${head_host#[}
head_host=${head_host%]}  # [IPv6]:port
if ! python -c 'import socket, sys; socket.getaddrinfo(sys.argv[1], None)' "$head_host" 2>/dev/null; then
  echo "error: HEAD=$HEAD: the machine $head_host is not known here (give a name or address every machine reaches)" >&2
  exit 2
fi
# Every machine gives the same NNODES: torchrun waits for that many (up to its rendezvous timeout, 600 s).
nnodes=${NNODES:-2}
nproc=${NPROC_PER_NODE:-$(python -c 'import torch; print(torch.cuda.device_count())')}
if [ "$nproc" = 0 ]; then
  echo "no GPU on this machine: 1 training process here (set NPROC_PER_NODE=N for N)"
  nproc=1
fi

# First the checks a training makes before it starts, in one process that sees the layout torchrun will give
# the first: a refused command stops here with its one error line. (torchrun would start it again, up to
# MAX_RESTARTS times, then end in a traceback of its own.)
WORLD_SIZE=$((nnodes * nproc)) LOCAL_WORLD_SIZE=$nproc GROUP_WORLD_SIZE=$nnodes RANK=0 LOCAL_RANK=0 GROUP_RANK=0 \
  TORCHELASTIC_RUN_ID=$RUN_ID python -m {{ cookiecutter.package_name }}.train "$@" check_only=true

# Each restart meets in a new store: in the one torchrun shares with its workers by default, a restarted worker
# can find a dead one's address and hang (torch 2.13; see warn_if_restarts_can_hang in launcher.py).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
exec python -m torch.distributed.run \
  --nnodes="$nnodes" --nproc-per-node="$nproc" \
  --rdzv-backend=c10d --rdzv-endpoint="$HEAD" --rdzv-id="$RUN_ID" \
  --max-restarts="${MAX_RESTARTS:-3}" \
  -m {{ cookiecutter.package_name }}.train "$@"
