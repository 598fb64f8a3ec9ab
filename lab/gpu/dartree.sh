#!/usr/bin/env bash
# DARTree's bar (issue 28) on one GPU, after setup.sh and join.sh, in the background (it outlives the call):
#   (PROMPTS=~/repo/.whl/prompts-t4.npz GEN_MIN=3 FIT_MIN=5 setsid nohup bash ~/repo/lab/gpu/dartree.sh \
#      > ~/st/dartree.log 2>&1 < /dev/null &)
# 1. a corpus of the target's greedy responses (tfm-train data, torch backend, GEN_MIN minutes), unless
#    ~/w/c0 holds one;
# 2. a Weaver of the default pair (tfm-train weaver, FIT_MIN minutes; held-out tau of chain / DDTree / TfM at
#    TREES nodes and DARTree's W and K sweep in its log); GGUFs in ~/st/dartree/;
# 3. once the CUDA build is done (~/st/build.done): the backend DARTree's test on the CPU and the GPU
#    (tests.log); tfm-bench trees, the ms of a TfM heap tree against a
#    DARTree built on the host and on the backend, GPU and CPU, B = 16 and 64 (trees.json);
# 4. tfm-bench greedy, first BENCH_N prompts a set, MAXTOK tokens: plain, chain, DDTree@64, TfM@64 and
#    DARTree@64 with the same Weaver (bench.json): tau, tokens/s and tree ms a step side by side.
# Environment: PROMPTS, GEN_MIN (3), MAXNEW (256), FIT_MIN (5), TREES (16,64), BENCH_N (40), MAXTOK (128).
set -uo pipefail
. ~/env.sh
OUTD=${ST:-~/st}/dartree
mkdir -p $OUTD
cd ~/repo
T=~/w/model.gguf
if [ ! -e ~/w/c0/manifest.json ]; then
  python3 -m tfm_local.cli.train data --target $T --prompts "$PROMPTS" --out ~/w/c0 --backend torch \
    --batch-size 512 --max-new-tokens "${MAXNEW:-256}" --time-budget "${GEN_MIN:-3}" > $OUTD/gen.log 2>&1 \
    || { echo "corpus generation failed (dartree/gen.log)"; exit 1; }
fi
python3 -m tfm_local.cli.train weaver --corpus ~/w/c0 --target $T --drafter auto --out ~/w/weaver \
  --steps 3000 --time-budget "${FIT_MIN:-5}" --trees "${TREES:-16,64}" --holdout 64 --batch-tokens 16384 \
  --anchors 16 --log-every 50 > $OUTD/fit.log 2>&1 || { echo "weaver fit failed (dartree/fit.log)"; exit 1; }
cp ~/w/weaver/export/*.gguf $OUTD/ && touch ${ST:-~/st}/weaver.done
bash ~/repo/lab/gpu/wait.sh 900 ${ST:-~/st}/build.done
W=~/w/weaver/export/weaver-q8_0.gguf
python3 -m pytest -q -p no:cacheprovider tests/test_weaver.py -k "backend_is_the_hosts" > $OUTD/tests.log 2>&1
python3 -m tfm_local.bench trees --weaver $W --target $T --budgets 16,64 --drafts 30 --json $OUTD/trees.json \
  > $OUTD/trees.log 2>&1
python3 -m tfm_local.bench --target $T --drafter auto --threads 4 --no-plot --weaver $W \
  --modes plain,chain,ddtree@64,tfm@64,dartree@64 -n "${BENCH_N:-40}" --max-tokens "${MAXTOK:-128}" \
  --json $OUTD/bench.json > $OUTD/bench.log 2>&1 && touch ${ST:-~/st}/dartree.done
