#!/usr/bin/env bash
# The first Weaver run for the default pair on one GPU, after setup.sh, the CUDA build and join.sh, in the
# background (it outlives the call that starts it):
#   (PROMPTS=~/repo/.whl/prompts-t4.npz GEN_MIN=4 FIT_MIN=6 setsid nohup bash ~/repo/lab/gpu/weaver.sh \
#      > ~/st/weaver.log 2>&1 < /dev/null &)
# 1. a corpus of the target's greedy responses (tfm-train data, torch backend, GEN_MIN minutes), unless
#    ~/w/c0 holds one already;
# 2. tfm-train weaver on it with the shipped drafter, the last 64 sequences held out: at the end the
#    held-out τ of the chain, DDTree and TfM at 16, 32 and 64 nodes (docs/training.md), the log and the
#    Weaver GGUFs in ~/st/weaver/; 3. tfm-bench of plain, DDTree and TfM with it (bench-tfm.json). Environment: PROMPTS, GEN_MIN, MAXNEW (256), STEPS (3000), FIT_MIN
#    (minutes of training steps, the schedule fitted to them; default: STEPS steps), TREES (16,32,64), BENCH_N (40), WEAVER_OPTS
#    (extra tfm-train weaver options, e.g. "--width 512 --top-k 128").
set -uo pipefail
. ~/env.sh
mkdir -p ${ST:-~/st}/weaver
cd ~/repo
T=~/w/model.gguf
if [ ! -e ~/w/c0/manifest.json ]; then
  python3 -m tfm_local.cli.train data --target $T --prompts "$PROMPTS" --out ~/w/c0 --backend torch \
    --batch-size 512 --max-new-tokens "${MAXNEW:-256}" --time-budget "${GEN_MIN:-6}" > ${ST:-~/st}/weaver/gen.log 2>&1 \
    || { echo "corpus generation failed (weaver/gen.log)"; exit 1; }
fi
python3 -m tfm_local.cli.train weaver --corpus ~/w/c0 --target $T --drafter auto --out ~/w/weaver \
  --steps "${STEPS:-3000}" ${FIT_MIN:+--time-budget $FIT_MIN} --trees "${TREES:-16,32,64}" \
  --holdout 64 --batch-tokens 16384 --anchors 16 --log-every 50 ${WEAVER_OPTS:-} \
  > ${ST:-~/st}/weaver/fit.log 2>&1 || { echo "weaver fit failed (weaver/fit.log)"; exit 1; }
cp ~/w/weaver/export/*.gguf ${ST:-~/st}/weaver/ && touch ${ST:-~/st}/weaver.done
# 3. the engine with it: plain, DDTree and TfM at 16 and 64 nodes, greedy, 40 prompts a set (BENCH=0: skip)
[ "${BENCH:-1}" = 0 ] || python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot \
  --weaver ~/w/weaver/export/weaver-q8_0.gguf --modes plain,ddtree@16,tfm@16,ddtree@64,tfm@64 -n "${BENCH_N:-40}" --max-tokens 256 \
  --json ${ST:-~/st}/weaver/bench-tfm.json > ${ST:-~/st}/weaver/bench.log 2>&1 && touch ${ST:-~/st}/weaver-bench.done
