#!/usr/bin/env bash
# Every GPU benchmark in one go, most important first, for a GPU machine lent for minutes (offline; its Python has
# torch, Lightning and accelerate). Each step has its own time limit and writes its log to $OUT as it ends, so a
# session cut short keeps what it measured. Prepare here, then carry build/gpu:
#   bash ../shared/gpu/wheels.sh build/gpu/whl                      # hydra, wandb, optuna, ...
#   pip download --no-deps torchao==0.18.0 ... -d build/gpu/ao      # (and older ones: the first that trains is used)
#   cookiecutter --no-input --output-dir build/gpu/bake/<engine> . engine=<engine>    # lightning and accelerate
# Steps: 1. the GPT at ~470M (dim 2048, 8 blocks), template (bench) vs the raw loop, Lightning then Accelerate (MFU,
# template / loop); 2. the GPT at ~1.12B (dim 3072, 9 blocks), bf16 then float8=tensorwise; 3. bench memory at
# ~470M without compile: step time and peak memory under activation_checkpointing=none|full|selective; 4. float8=
# rowwise at 1.12B; 5. bench memory's largest batch per mode; 6. pytest -m gpu (Lightning). ONLY1=1: step 1 alone;
# ENGINES: step 1's engines (default: lightning accelerate); SKIP1=1: all but step 1 (the whole script needs more
# than one 600 s call: Lightning's step 1 alone took 140 s on an H200).
# DRY=1: the same on the CPU, tiny, fp32, no compile, no float8 (a dry run of the script; its figures mean nothing).
set -u
ROOT=$PWD
GPU=$ROOT/build/gpu
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1 WANDB_DIR=/tmp/wandb
START=$(date +%s)
log() { echo "[$(( $(date +%s) - START )) s] $*" | tee -a "$OUT/summary.txt"; }

if [ -z "${DRY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$GPU"/whl/*.whl \
    > "$OUT/install.log" 2>&1 || { log "install failed"; exit 1; }
  for wheel in $([ -z "${ONLY1:-}" ] && ls -r "$GPU"/ao/torchao-*.whl); do  # the newest torchao whose float8 trains with this torch
    rm -rf /tmp/ao; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ao "$wheel" > /dev/null 2>&1
    if PYTHONPATH=/tmp/ao timeout 90 python3 -c "import torch; from torchao.float8 import convert_to_float8_training as c; m=torch.nn.Sequential(torch.nn.Linear(256,256)).cuda(); c(m); m(torch.randn(32,256,device='cuda')).sum().backward()" >> "$OUT/ao.log" 2>&1; then
      AO=/tmp/ao; log "torchao: $wheel"; break
    fi
    AO=
  done
  export PYTHONPATH=/tmp/site${AO:+:$AO}
  MID=470m; BIG=1b; CPU=; DEV="trainer.accelerator=gpu trainer.precision=bf16-mixed"; F8A=tensorwise; F8B=rowwise
  read -r DIM DEPTH HEADS BATCH SEQ VOCAB <<< "3072 9 24 16 1024 32768"
  read -r MDIM MDEPTH MHEADS MBATCH <<< "2048 8 16 32"
else
  MID=tiny; BIG=tiny; CPU=--cpu; DEV="trainer.accelerator=cpu trainer.precision=32-true"; F8A=none; F8B=none
  read -r DIM DEPTH HEADS BATCH SEQ VOCAB <<< "64 2 2 4 32 64"
  read -r MDIM MDEPTH MHEADS MBATCH <<< "64 2 2 4"
fi
{ nvidia-smi -L; python3 -c "import torch, lightning, accelerate; print(torch.__version__, lightning.__version__, accelerate.__version__)"; } > "$OUT/env.txt" 2>&1
log "$(tr '\n' ' ' < "$OUT/env.txt")"
COMPILE=$([ -z "$CPU" ] && echo true || echo false)

# 1. template vs raw loop at ~470M, both engines (the loop runs beside each engine's template)
for engine in $([ -z "${SKIP1:-}" ] && echo ${ENGINES:-lightning accelerate}); do
  timeout ${LIMIT1:-240} python3 benchmarks/gpu_overhead.py --baked "$GPU/bake" --engine $engine --size $MID --warmup 3 --steps 15 \
    --limit ${POINT_LIMIT:-100} --logs "$OUT/1" $CPU > "$OUT/1-$engine.txt" 2> "$OUT/1-$engine.err"
  log "1. $engine exit $?"; tail -n 2 "$OUT/1-$engine.txt" | tee -a "$OUT/summary.txt"
done

GPT() {  # the GPT of size $1 (mid | big) as train overrides
  if [ "$1" = mid ]; then echo "model=gpt model.net.dim=$MDIM model.net.depth=$MDEPTH model.net.num_heads=$MHEADS data.seq_len=$SEQ data.vocab_size=$VOCAB data.batch_size=$MBATCH"
  else echo "model=gpt model.net.dim=$DIM model.net.depth=$DEPTH model.net.num_heads=$HEADS data.seq_len=$SEQ data.vocab_size=$VOCAB data.batch_size=$BATCH"; fi
}
cd "$GPU/bake/lightning/scaled-trainer" || exit 1
export PYTHONPATH=src:${PYTHONPATH:-}
scaling() {  # float8 mode, limit
  rm -rf /tmp/b-$1
  timeout $2 python3 -m scaled_trainer.bench scaling $(GPT big) $DEV compile=$COMPILE float8=$1 bench.devices=[1] bench.timeout_s=$(( $2 - 20 )) \
    bench.warmup_steps=4 bench.steps=15 bench.peak_tflops=989 logger=none hydra.run.dir=/tmp/b-$1 > "$OUT/2-$1.log" 2>&1
  log "2. 1.12B float8=$1 exit $?: $(tail -n +2 /tmp/b-$1/scaling.csv 2>/dev/null)"
}
memory() {  # find_batch, limit, modes
  rm -rf /tmp/m-$1
  timeout $2 python3 -m scaled_trainer.bench memory $(GPT mid) $DEV compile=false bench.find_batch=$1 \
    bench.activation_checkpointing=$3 bench.max_batch_size=256 bench.timeout_s=$(( $2 / 3 )) bench.warmup_steps=3 bench.steps=8 bench.peak_tflops=989 \
    logger=none hydra.run.dir=/tmp/m-$1 > "$OUT/3-memory-$1.log" 2>&1
  log "3. memory find_batch=$1 exit $?"; cat /tmp/m-$1/memory.csv >> "$OUT/summary.txt" 2>/dev/null
}
[ -n "${ONLY1:-}" ] && exit 0
# 2. float8 against bf16 at 1.12B
scaling none 150
scaling $F8A 170
# 3. activation checkpointing: step time and peak memory at the same batch (eager: compile would reshape memory)
memory false 150 [none,full,selective]
# 4, 5: the rest, if time remains
scaling $F8B 170
memory true 240 [none,full]
# 6. the GPU check
[ -n "${DRY:-}" ] && exit 0
WANDB_DIR=/tmp/wandb timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests > "$OUT/6-gpu-check.log" 2>&1
log "6. pytest -m gpu exit $?: $(tail -n 1 "$OUT/6-gpu-check.log")"
