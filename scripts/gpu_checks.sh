#!/bin/bash
# The GPU checks of docs/speed.md, most needed first, each bounded so that a call returns what finished: bench eager
# (ViT-B/16 at 224 and at 448 px, bf16, training steps too), the memory sweeps (ViT-S/16 224 -> 1024 px, a ViT-S
# training step at 448 px, ViT-B/16 at 1024 px batch 8), then bench --compile. Eager and memory take about 345 s on an
# H200; compile needs at least 380 s of its own (its warm-up alone took 173-185 s, and every model must start compiling
# within --compile-budget), so a 15-minute lease takes it in two calls, compile first: PHASES "compile" with SECONDS
# 450, then "eager memory" with what is left. "sweep" (not in the default) times ViT-S/16 from 224 to 1024 px in one
# process, eager (docs/speed.md's sweep in one process): run it in the next lease, or after the others where time is
# left. PHASES ("eager memory compile" by default) names what a call runs:
#   bash scripts/gpu_checks.sh COMMIT [SECONDS] [PHASES]   # results land in $OUT (default outputs/gpu)
# Copy them to results/ (their commands name $OUT: write results/ there) and redraw their plots.
# Where the tree travels without .git, COMMIT names the code (PAPE_HUB_LAB_COMMIT); timm is installed from .whl/ if
# that folder exists (the device image may carry another timm).
set +e
export PYTHONUNBUFFERED=1 PAPE_HUB_LAB_COMMIT="$1" TOKENIZERS_PARALLELISM=false
OUT=${OUT:-outputs/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
LIMIT=${2:-540}
PHASES=${3:-eager memory compile}
has() { [[ " $PHASES " == *" $1 "* ]]; }
left() { echo $((LIMIT - SECONDS)); }
{
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name())"
if has eager; then
echo "=== bench eager 224 px, $(left) s left"  # ~170 s on an H200 (dense LieRE's training steps)
timeout 200 python3 -m lab bench --device cuda --dtype bfloat16 --resolutions 224 --train-skip "" \
  --output "$OUT/bench_vit_b16_cuda.json"
echo "=== bench eager 448 px, $(left) s left"  # ~120 s; dense LieRE's training step takes seconds there
timeout 150 python3 -m lab bench --device cuda --dtype bfloat16 --resolutions 448 --train-skip liere --repeats 5 \
  --output "$OUT/bench_vit_b16_448_cuda.json"
fi
if has memory; then
echo "=== memory inference, $(left) s left"
timeout 120 python3 -m lab memory --device cuda --repeats 5 --output "$OUT/memory_vit_s16_cuda.json"
echo "=== memory training, $(left) s left"
timeout 60 python3 -m lab memory --device cuda --train --resolutions 448 --batch-size 4 --repeats 5 \
  --output "$OUT/memory_train_vit_s16_448_cuda.json"
echo "=== memory ViT-B 1024 px batch 8, $(left) s left"
timeout 100 python3 -m lab memory --device cuda --size b --resolutions 1024 --inference-batch-size 8 --repeats 1 \
  --output "$OUT/memory_vit_b16_1024_b8_cuda.json"
fi
if has compile; then
L=$(left); echo "=== bench compiled, $L s left"
if ((L < 380)); then echo "skipped: the compile phase needs 380 s (warm-up about 180 s); run it in a call of its own"
else
timeout $((L - 5)) python3 -m lab bench --device cuda --dtype bfloat16 --compile --compile-workers 8 \
  --compile-budget $((L - 60)) --train-batch-size 0 --repeats 5 --output "$OUT/bench_vit_b16_224_compiled_cuda.json"
fi
fi
if has sweep; then
echo "=== bench sweep ViT-S/16 224 -> 1024 px, eager, $(left) s left"
timeout $(( $(left) > 5 ? $(left) - 5 : 1 )) python3 -m lab bench --device cuda --dtype bfloat16 --sizes s \
  --resolutions 224,448,640,896,1024 --batch-size 1 --train-batch-size 0 --repeats 5 \
  --output "$OUT/bench_vit_s16_sweep_cuda.json"
fi
echo "=== done at $SECONDS s"
} 2>&1 | grep -v -i "warn" | tee "$OUT/log.txt"
