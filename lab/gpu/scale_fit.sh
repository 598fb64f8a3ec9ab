#!/usr/bin/env bash
# One GPU: a corpus of new data, a fit warm-started from the shipped drafter
# measured as the engine does, then the walk and (optionally) tfm-bench of both drafters.
# Run detached after setup.sh and join.sh:
#   setsid nohup bash ~/repo/lab/gpu/scale_fit.sh > ~/st/scale.log 2>&1 < /dev/null &
# 1. three `tfm-train data` at once on the GPU (torch, batch 512, <= 256 new tokens, GEN_MIN minutes):
#    sampled T 0.8 seed 5 from rank 0, sampled seed 6 from the middle (responses L3i never saw: it was fitted
#    on greedy and seeds 1-4), greedy on the last HELD ranks (the held-out tail: engine-like responses);
# 2. the fit: --init-from the shipped drafter, FIT_MIN minutes, held-out 256 walked at step 0 and the end
#    per kind (--kinds), writing and role-play prompts twice (--emphasis);
# 3. `tfm-train walk` of the shipped and the new q4_0 drafter on tfm-bench's recorded greedy outputs
#    (.whl/bench-seqs.npz: HumanEval / GSM8K / MT-Bench, 40 each); pack the q4_0 GGUF and the logs;
# 4. BENCH=1 (and the CUDA build done): tfm-bench chain, 40 prompts, 256 tokens, new then shipped drafter.
set -uo pipefail
. ~/env.sh
ST=${ST:-$HOME/st}; mkdir -p "$ST"
cd ~/repo
T=~/w/model.gguf W=$HOME/repo/.whl
P=$W/prompts-t16.npz
INIT=$HOME/repo/tfm_local/assets/qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf
N=$(python3 -c "from tfm_local.train.prompts import PromptFile; print(len(PromptFile.load('$P').ids))")
H=${HELD:-1024}
M=$(( (N - H) / 2 ))
echo "$(date +%T) $N prompt ranks: s5 [0, $M), s6 [$M, $((N - H))), g [$((N - H)), $N)"
gen() { python3 -m tfm_local.cli.train data --target $T --prompts $P --backend torch --batch-size 512 \
  --max-new-tokens 256 --time-budget "${GEN_MIN:-6}" "$@"; }
if [ -z "${SKIP_GEN:-}" ]; then
  gen --out ~/w/g --first-prompt $((N - H)) -n $N > $ST/gen-g.log 2>&1 || touch $ST/gen-g.failed &
  gen --out ~/w/s5 --temperature 0.8 --sample-seed 5 -n $M > $ST/gen-s5.log 2>&1 || touch $ST/gen-s5.failed &
  gen --out ~/w/s6 --temperature 0.8 --sample-seed 6 --first-prompt $M -n $((N - H)) > $ST/gen-s6.log 2>&1 \
    || touch $ST/gen-s6.failed &
  wait
fi
ls $ST/gen-*.failed 2> /dev/null && { echo "$(date +%T) generation failed"; touch $ST/all.done; exit 1; }
echo "$(date +%T) corpus done"; touch $ST/gen.done
for c in s5 s6 g; do python3 -c "import json; print('$c', json.load(open('$HOME/w/$c/manifest.json'))['counts'])"; done
python3 -m tfm_local.cli.train fit --corpus ~/w/s5 ~/w/s6 ~/w/g --target $T --init-from $INIT --out ~/w/run0 \
  --anchors 48 --batch-tokens 16384 --epochs 40 --save-every 100000 --time-budget "${FIT_MIN:-11}" --holdout 256 \
  --eval-every 250 --outtype q4_0 --lr ${LR:-3e-4} --soft-weight 0.5 --seed 3 \
  --emphasis $W/emphasis-writing-t16.npz --emphasis-times 2 --kinds $W/kinds-t16.npz > $ST/fit.log 2>&1 \
  || { echo "$(date +%T) fit failed"; touch $ST/fit.failed $ST/all.done; exit 1; }
echo "$(date +%T) fit done"; touch $ST/fit.done
cp ~/w/run0/log.jsonl $ST/fit-log.jsonl
python3 -m tfm_local.cli.train walk --target $T --drafter $INIT ~/w/run0/export/drafter-q4_0.gguf \
  --seqs $W/bench-seqs.npz --json $ST/walk-bench.json > $ST/walk.log 2>&1
echo "$(date +%T) walk done"
PACK_TYPES=q4_0 bash lab/gpu/pack.sh ~/w/run0 $ST/run0
echo "$(date +%T) packed"; touch $ST/all.done
