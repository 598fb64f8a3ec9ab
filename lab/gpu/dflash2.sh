#!/usr/bin/env bash
# The first DFlash2 drafter of the default pair on one GPU (issue 29's bar), after setup.sh, the CUDA build
# and join.sh, in the background (it outlives the call that starts it):
#   (PROMPTS=~/repo/.whl/prompts-t4.npz GEN_MIN=4 FIT_MIN=12 setsid nohup bash ~/repo/lab/gpu/dflash2.sh \
#      > ~/st/dflash2.log 2>&1 < /dev/null &)
# 1. a corpus of the target's greedy responses (tfm-train data, torch backend, GEN_MIN minutes), unless
#    ~/w/c0 holds one already (weaver.sh and pipeline.sh write the same);
# 2. tfm-train fit --dflash2 warm-started from the shipped DFlash drafter (its convolutions and selector start
#    as the identity: step 0 drafts as it does), selector rank RANK (default 64: codebooks of 2 x 151,936 x 64,
#    11 MB in q4_0), FIT_MIN minutes, the drafter's own recipe (pipeline.sh's fit options); GGUFs in
#    ~/st/dflash2/;
# 3. the bar, greedy, 40 prompts a set, 256 tokens, two tfm-bench runs (one drafter each; tau does not depend
#    on the machine's load): the shipped DFlash drafter's chain and DDTree@64 (bench-dflash.json), the DFlash2
#    drafter's chain (its lattice's greedy walk), DDTree@64 over its marginals, lattice@64 and dartree@64
#    (bench-dflash2.json). Bar: DFlash2 chain tau >= 1.15 x the DFlash chain's, lattice@64 >= ddtree@64 of
#    the DFlash2 drafter, on each set.
# Environment: PROMPTS, GEN_MIN, MAXNEW (256), FIT_MIN (12), RANK (64), FIT_OPTS (extra fit options),
# BENCH_N (40), BENCH=0 (skip 3).
set -uo pipefail
. ~/env.sh
OUTD=${ST:-~/st}/dflash2
mkdir -p $OUTD
cd ~/repo
T=~/w/model.gguf
INIT=$HOME/repo/tfm_local/assets/qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf
if [ ! -e ~/w/c0/manifest.json ]; then
  python3 -m tfm_local.cli.train data --target $T --prompts "$PROMPTS" --out ~/w/c0 --backend torch \
    --batch-size 512 --max-new-tokens "${MAXNEW:-256}" --time-budget "${GEN_MIN:-6}" > $OUTD/gen.log 2>&1 \
    || { echo "corpus generation failed (dflash2/gen.log)"; exit 1; }
fi
python3 -m tfm_local.cli.train fit --corpus ~/w/c0 --target $T --init-from "$INIT" --dflash2 \
  --selector-rank "${RANK:-64}" --anchors 48 --batch-tokens 16384 --epochs 40 --save-every 100000 \
  --time-budget "${FIT_MIN:-12}" --holdout 256 --eval-every 250 --outtype q4_0 q8_0 --out ~/w/dflash2 \
  ${FIT_OPTS:-} > $OUTD/fit.log 2>&1 || { echo "dflash2 fit failed (dflash2/fit.log)"; exit 1; }
cp ~/w/dflash2/export/*.gguf $OUTD/ && ls -l $OUTD/*.gguf && touch ${ST:-~/st}/dflash2.done
[ "${BENCH:-1}" = 0 ] && exit 0
bench=(python3 -m tfm_local.bench --target $T --threads 4 --no-plot -n "${BENCH_N:-40}" --max-tokens 256)
"${bench[@]}" --drafter "$INIT" --modes plain,chain,ddtree@64 --json $OUTD/bench-dflash.json > $OUTD/bench-dflash.log 2>&1
"${bench[@]}" --drafter ~/w/dflash2/export/drafter-q4_0.gguf --modes plain,chain,ddtree@64,lattice@64,dartree@64 \
  --json $OUTD/bench-dflash2.json > $OUTD/bench-dflash2.log 2>&1 && touch ${ST:-~/st}/dflash2-bench.done
