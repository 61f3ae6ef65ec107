#!/usr/bin/env bash
# Start a real single-host SLURM (Debian's slurm-wlm + munge) so that the baked projects' SLURM tests run.
# Idempotent: exits 0 at once when `sinfo` already answers. Needs root (apt-get, munge, slurmd).
# Exits non-zero with one line on stderr when SLURM cannot be started; the SLURM tests then skip with a reason.
set -euo pipefail

log() { echo "slurm.sh: $*" >&2; }
answers() { timeout 10 sinfo -h >/dev/null 2>&1; }

if command -v sinfo >/dev/null && answers; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "not root: cannot install or start SLURM"
  exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  log "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

# munge authenticates SLURM's messages: a key readable by the munge user only.
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  head -c 1024 /dev/urandom >/etc/munge/munge.key
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 400 /etc/munge/munge.key
if ! pgrep -u munge -x munged >/dev/null; then
  runuser -u munge -- munged
fi

# One node (this machine, as slurmd sees it), one default partition. linuxproc/none: no cgroups needed,
# so it also runs in a container.
host=$(hostname -s)
node=$(slurmd -C | head -n 1)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat >/etc/slurm/slurm.conf <<EOF
ClusterName=ci
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# A requeued or cancelled job's tasks get SIGTERM, then SIGKILL after KillWait (30 s by default). Lightning answers
# SIGTERM with a collective, which a task stalled by a test never joins: each requeue test waited the whole 30 s.
KillWait=5
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd

for _ in $(seq 60); do
  if [ "$(sinfo -h -o %t 2>/dev/null)" = idle ]; then
    log "SLURM is up: $(sinfo -h -o '%P %D %c %t')"
    exit 0
  fi
  sleep 1
done
log "SLURM did not become idle in 60 s; see /var/log/slurm/"
exit 1
