#!/usr/bin/env bash
# After pipeline.sh: each fit's q4_0 drafter on the chain over the first 40 prompts of MT-Bench, GSM8K and
# HumanEval (greedy, 256 new tokens, full draft vocabulary), one GPU per run, side by side:
#   setsid nohup bash ~/repo/lab/gpu/compare.sh > ~/st/compare.log 2>&1 < /dev/null &
# Picks which run the development machine's CPU benchmark (the bar's measurement) should confirm.
# Outputs ${ST:-~/st}/bench-run<g>.json/.txt (and profile.json/.txt with PROFILE=1), then compare.done.
set -uo pipefail
. ~/env.sh
cd ~/repo
while [ ! -e ${ST:-~/st}/all.done ]; do sleep 5; done
for g in ${FIT_GPUS:-0 1}; do
  D=~/w/run$g/export/drafter-q4_0.gguf
  [ -e $D ] || continue
  CUDA_VISIBLE_DEVICES=$g python3 -m tfm_local.bench --target ~/w/model.gguf --drafter $D --threads 4 \
    --modes chain --sets mtbench,gsm8k,humaneval -n 40 --max-tokens 256 --no-plot \
    --json ${ST:-~/st}/bench-run$g.json > ${ST:-~/st}/bench-run$g.txt 2>&1 &
done
wait
# PROFILE=1: where a verify pass and a drafter step spend their time (kernels against wall clock), GPU 0
[ -n "${PROFILE:-}" ] && CUDA_VISIBLE_DEVICES=0 python3 -m tfm_local.bench.profile_passes --target ~/w/model.gguf --drafter auto \
  --tokens 1,8,16 --iters 20 --json ${ST:-~/st}/profile.json > ${ST:-~/st}/profile.txt 2>&1
touch ${ST:-~/st}/compare.done
