#!/usr/bin/env bash
# The GPU benchmarks in one go, for a GPU machine lent for minutes (offline, torch/Lightning/accelerate installed), logs
# to $OUT. Before: bake both engines into .gpu/<engine>/ (cookiecutter --no-input --output-dir .gpu/lightning .
# engine=lightning, the same for accelerate), build the wheels (bash ../shared/gpu/wheels.sh .whl) and put torchao
# wheels in .gpu/ao/; carry .whl and .gpu. PART=1: the GPT at ~362M, template (bench) vs the raw loop, both engines.
# PART=2: the GPT at ~1.08B, the template's bench in bf16 and with float8=tensorwise and rowwise (Lightning), and
# the raw loop with float8=tensorwise. DRY=1: the same on the CPU, tiny, no bf16/compile/float8 (a dry run).
set -u
ROOT=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1 WANDB_DIR=/tmp/wandb
if [ -z "${DRY:-}" ]; then
  [ -d /tmp/site/hydra ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  if [ "${PART:-1}" = 2 ] && [ ! -f /tmp/site.ao ]; then  # the newest torchao whose float8 trains with this torch
    for v in 0.18.0 0.17.0 0.16.0; do
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ao-$v .gpu/ao/torchao-$v-*.whl
      if PYTHONPATH=/tmp/ao-$v python3 -c "import torch; from torchao.float8 import convert_to_float8_training as c; m=torch.nn.Sequential(torch.nn.Linear(256,256)).cuda(); c(m); m(torch.randn(32,256,device='cuda')).sum().backward()" > "$OUT/ao-$v.log" 2>&1; then
        echo /tmp/ao-$v > /tmp/site.ao; break
      fi
    done
  fi
  export PYTHONPATH=/tmp/site:$(cat /tmp/site.ao 2>/dev/null)
  BIG=350m; HUGE=1b; CPU=; DEV="trainer.accelerator=gpu trainer.precision=bf16-mixed compile=true"
  F8A=tensorwise; F8B=rowwise
else
  BIG=tiny; HUGE=tiny; CPU=--cpu; DEV="trainer.accelerator=cpu trainer.precision=32-true"; F8A=none; F8B=none
fi
{ nvidia-smi -L; python3 -c "import torch, lightning, accelerate; print(torch.__version__, lightning.__version__, accelerate.__version__)"; echo "torchao: $(cat /tmp/site.ao 2>/dev/null)"; } > "$OUT/env.txt" 2>&1
if [ "${PART:-1}" = 1 ]; then
  timeout ${LIMIT:-330} python3 benchmarks/gpu_overhead.py --baked .gpu --size $BIG --warmup 3 --steps 10 $CPU > "$OUT/p1.txt" 2> "$OUT/p1.err"
  echo "part 1 exit $?" >> "$OUT/p1.txt"; cat "$OUT/p1.txt"
else
  cd .gpu/lightning/scaled-trainer
  read -r DIM DEPTH HEADS BATCH <<< "$([ "$HUGE" = 1b ] && echo '2048 20 16 8' || echo '64 2 2 4')"
  SEQ=$([ "$HUGE" = 1b ] && echo 1024 || echo 32); VOCAB=$([ "$HUGE" = 1b ] && echo 32768 || echo 64)
  for f8 in none $F8A $F8B; do
    rm -rf /tmp/b1-$f8
    PYTHONPATH=src:${PYTHONPATH:-} timeout 200 python3 -m scaled_trainer.bench scaling model=gpt model.net.dim=$DIM model.net.depth=$DEPTH \
      model.net.num_heads=$HEADS data.seq_len=$SEQ data.vocab_size=$VOCAB data.batch_size=$BATCH $DEV float8=$f8 \
      bench.devices=[1] bench.warmup_steps=5 bench.steps=20 bench.peak_tflops=989 logger=none \
      hydra.run.dir=/tmp/b1-$f8 > "$OUT/p2-$f8.log" 2>&1
    echo "float8=$f8 exit $?: $(tail -n +2 /tmp/b1-$f8/scaling.csv 2>/dev/null)" >> "$OUT/p2.txt"
  done
  cd "$ROOT"
  PYTHONPATH=.gpu/lightning/scaled-trainer/src:${PYTHONPATH:-} timeout 150 python3 benchmarks/gpu_loop.py scaled_trainer --dim=$DIM --depth=$DEPTH --heads=$HEADS --seq=$SEQ \
    --vocab=$VOCAB --batch=$BATCH --float8=$F8A $CPU $([ -n "$CPU" ] && echo --no-compile) \
    > "$OUT/p2-loop.log" 2>&1; echo "loop float8=$F8A exit $?: $(tail -1 "$OUT/p2-loop.log")" >> "$OUT/p2.txt"
  cat "$OUT/p2.txt"
fi
