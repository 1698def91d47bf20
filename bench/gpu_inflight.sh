#!/usr/bin/env bash
# The device call of bench/gpu_inflight.py, every part side by side where the GPUs allow,
# then the merge into OUT/gpu-inflight.json.
#   OUT=DIR [STEPS=8] [PHASE_S=240] [PARTS=split|all] [STEPS1=STEPS] [PHASE1_S=PHASE_S]
#     [LAG=3] bash bench/gpu_inflight.sh [key=value ...]
# 4 GPUs or more: the one-GPU plans (colocated streamed with and without in-flight updates,
# the unstreamed partial rollout) and the kv gap one GPU each, then the two-GPU split plan
# with and without in-flight updates on two GPU pairs. 2 GPUs: the split plan with, then
# without in-flight updates on both, and (PARTS=all) first the colocated streamed plan with
# in-flight updates beside the unstreamed partial rollout. Each phase is cut at PHASE_S
# seconds (a mode cut short leaves its metrics mirrored in OUT). STEPS=8: the rounds after the
# fill (max_lag + 1 versions) are rated apart (samples_per_s_after_fill); 3 fit a small budget.
# STEPS1 and PHASE1_S: the same for the one-GPU plans (their target compares throughput only).
# A mode still running STOP_S (50) seconds before its phase ends stops after its running tasks
# and keeps the steps it finished, so STEPS may ask for more than fit. UNTIL_PREFIX=P
# (UNTIL_PREFIX1 for the one-GPU plans): a mode stops once it has trained every data position
# below P, so the plans compared do the same work, long tails included (`same_work`).
# UNTIL_PREFIX_INFLIGHT: the split in-flight part's own prefix (default UNTIL_PREFIX), to run it
# longer than the part it is compared with (`same_work` rates both to the smaller prefix).
# LAG (3, 6 or 8): the split pair's max_lag (the one-GPU plans keep 3). NAME: the merged file's
# name (gpu-inflight).
set -u
OUT=${OUT:?OUT=DIR}
STEPS=${STEPS:-8}
PHASE_S=${PHASE_S:-240}
PARTS=${PARTS:-split}
STEPS1=${STEPS1:-$STEPS}
PHASE1_S=${PHASE1_S:-$PHASE_S}
STOP_S=${STOP_S:-50}
UNTIL_PREFIX=${UNTIL_PREFIX:-}
UNTIL_PREFIX1=${UNTIL_PREFIX1:-$UNTIL_PREFIX}
UNTIL_PREFIX_INFLIGHT=${UNTIL_PREFIX_INFLIGHT:-$UNTIL_PREFIX}
LAG=${LAG:-3}
NAME=${NAME:-gpu-inflight}
GPUS=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9][0-9]0' || echo H100)
WORKLOAD=("cluster.gpu=$GPU" "$@")

part() {  # [STEPS=.. PHASE_S=..] part NAME GPUS ARGS...
  local name=$1 gpus=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$gpus PYTHONUNBUFFERED=1 timeout "$PHASE_S" python3 bench/gpu_inflight.py \
    --steps "$STEPS" --stop-after-s "$((PHASE_S - STOP_S))" ${UNTIL_PREFIX:+--until-prefix \
    "$UNTIL_PREFIX"} --out "$OUT" --name "$name" "$@" \
    "${WORKLOAD[@]}" > "$OUT/$name.log" 2>&1
  echo "$name exit $? at $SECONDS s"
}

if [ "$GPUS" -ge 4 ]; then
  part part-stream-inflight 0 --modes stream4-colocated-lag3-inflight &
  part part-stream 1 --modes stream4-colocated-lag3 &
  part part-partial 2 --modes partial-lag3 &
  part part-kv 3 --kv-gap &
  wait
  UNTIL_PREFIX=$UNTIL_PREFIX_INFLIGHT part part-split-inflight 0,1 \
    --modes split-partial-lag$LAG-inflight &
  part part-split 2,3 --modes split-partial-lag$LAG &
  wait
else
  if [ "$PARTS" = all ]; then
    STEPS=$STEPS1 PHASE_S=$PHASE1_S UNTIL_PREFIX=$UNTIL_PREFIX1 part part-stream-inflight 0 \
      --modes stream4-colocated-lag3-inflight &
    STEPS=$STEPS1 PHASE_S=$PHASE1_S UNTIL_PREFIX=$UNTIL_PREFIX1 part part-partial 1 \
      --modes partial-lag3 &
    wait
  fi
  UNTIL_PREFIX=$UNTIL_PREFIX_INFLIGHT part part-split-inflight 0,1 \
    --modes split-partial-lag$LAG-inflight
  part part-split 0,1 --modes split-partial-lag$LAG
fi
python3 bench/gpu_inflight.py --merge "$OUT"/part-*.json --out "$OUT" --name "$NAME"
tail -n 4 "$OUT"/part-*.log
