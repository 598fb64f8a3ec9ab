#!/usr/bin/env bash
# The drafter run on a GPU machine, meant to run in the background after
# setup.sh and join.sh (it outlives the call that starts it):
#   setsid nohup bash ~/repo/lab/gpu/pipeline.sh > ${ST:-~/st}/pipeline.log 2>&1 < /dev/null &
# 1. corpus: the prompt file split in as many slices as GPUs, one `tfm-train data`
#    per GPU (greedy, torch backend), each stopped by GEN_MIN minutes;
# 2. fit: one run per GPU of FIT_GPUS (default: every GPU) on all slices together,
#    all starting from INIT, the same recipe except the per-GPU extra options FIT0, FIT1, ...;
# 2b. the corpus as a tar in 16 MiB pieces in ${ST:-~/st}/corpus/;
# 3. each run's GGUFs without vocabulary, log and held-out scores packed in ${ST:-~/st}/<run>/
#    as 16 MiB pieces (what a call can bring back).
# Environment: PROMPTS (prompt .npz), INIT (drafter to start from), GEN_MIN, MAXNEW,
# FIT_MIN, NGPU (default: every GPU), FIT_GPUS, FIT0.. (extra fit options per GPU; a later
# --time-budget overrides FIT_MIN), FIT_AFTER0.. (a file the GPU's fit waits for), SKIP_GEN (corpora
# already in ~/w/c0, c1, ...), GEN_PREFIX (slice folders ~/w/<prefix><g>, default c), GEN_OPTS (extra
# data options, e.g. "--temperature 0.8 --sample-seed 1"), CORPORA_EXTRA (more corpus folders for the fit),
# FIT_DDP (non-empty: one data-parallel fit over the GPUs of FIT_GPUS through torchrun, options FIT0, in run0),
# PACK_TYPES (the GGUF types exported and packed, default "q4_0 q8_0"), REFERENCE (non-empty: also a corpus of
# ShareGPT's own replies from PROMPTS, made with `prompts --replies`, in ~/w/r0, first in the fit's list).
set -uo pipefail
. ~/env.sh
mkdir -p ${ST:-~/st}
cd ~/repo
T=~/w/model.gguf
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
N=$(python3 -c "from tfm_local.train.prompts import PromptFile; print(len(PromptFile.load('$PROMPTS').ids))")
S=$(( (N + NGPU - 1) / NGPU ))
echo "$(date +%T) $N prompts, $NGPU slices of $S"
corpora=()
if [ -n "${REFERENCE:-}" ]; then  # no model runs: the replies are in the prompt file (CPU, alongside the generation)
  corpora+=(~/w/r0)
  python3 -m tfm_local.cli.train data --backend reference --target $T --prompts "$PROMPTS" --out ~/w/r0 \
    --max-new-tokens "$MAXNEW" > ${ST:-~/st}/ref.log 2>&1 || touch ${ST:-~/st}/gen-ref.failed &
fi
for g in $(seq 0 $((NGPU - 1))); do
  corpora+=(~/w/${GEN_PREFIX:-c}$g)
  [ -n "${SKIP_GEN:-}" ] && continue  # a generation started earlier: wait for it below
  CUDA_VISIBLE_DEVICES=$g python3 -m tfm_local.cli.train data --target $T --prompts "$PROMPTS" --out ~/w/${GEN_PREFIX:-c}$g ${GEN_OPTS:-} \
    --backend torch --batch-size 512 --max-new-tokens "$MAXNEW" --time-budget "$GEN_MIN" \
    --first-prompt $((g * S)) -n $(((g + 1) * S)) > ${ST:-~/st}/gen$g.log 2>&1 || touch ${ST:-~/st}/gen$g.failed &
done
wait
while pgrep -f "tfm_local.cli.train data" > /dev/null; do sleep 5; done
ls ${ST:-~/st}/gen*.failed 2> /dev/null && { echo "$(date +%T) corpus generation failed"; exit 1; }
corpora+=(${CORPORA_EXTRA:-})
echo "$(date +%T) corpus done: ${corpora[*]}"; touch ${ST:-~/st}/gen.done
# the corpus comes back in 16 MiB pieces (a later session can carry it up instead of generating it)
[ -z "${SKIP_GEN:-}" ] && mkdir -p ${ST:-~/st}/corpus && tar cf - -C ~/w $(cd ~/w && ls -d ${GEN_PREFIX:-c}[0-9]*) | split -b 16M -d -a 2 - ${ST:-~/st}/corpus/c.tar.
fit_args=(--corpus "${corpora[@]}" --target $T --init-from "$INIT" --anchors 48 --batch-tokens 16384 --epochs 40
  --save-every 100000 --time-budget "$FIT_MIN" --holdout 256 --eval-every 250 --outtype ${PACK_TYPES:-q4_0 q8_0})
if [ -n "${FIT_DDP:-}" ]; then  # one data-parallel fit over the GPUs of FIT_GPUS (torchrun), options FIT0, into run0
  gpus=(${FIT_GPUS:-$(seq 0 $((NGPU - 1)))})
  t_start=$SECONDS
  if ! CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${gpus[*]}") python3 -m torch.distributed.run --standalone \
      --nproc_per_node ${#gpus[@]} -m tfm_local.cli.train fit "${fit_args[@]}" --out ~/w/run0 ${FIT0:-} \
      > ${ST:-~/st}/fit0.log 2>&1; then
    # the data-parallel fit failed (first tried on NCCL here): the minutes left go to one GPU
    left=$(( FIT_MIN - (SECONDS - t_start) / 60 - 1 ))
    echo "$(date +%T) data-parallel fit failed (fit0.log); one GPU for $left min"; touch ${ST:-~/st}/ddp.failed
    [ $left -ge 2 ] && CUDA_VISIBLE_DEVICES=${gpus[0]} python3 -m tfm_local.cli.train fit "${fit_args[@]}" \
      --out ~/w/run0 --restart ${FIT0:-} --time-budget $left > ${ST:-~/st}/fit0-single.log 2>&1
  fi
  [ -e ~/w/run0/export/drafter-q4_0.gguf ] && bash ~/repo/lab/gpu/pack.sh ~/w/run0 ${ST:-~/st}/run0 || touch ${ST:-~/st}/fit0.failed
  echo "$(date +%T) all done"; touch ${ST:-~/st}/all.done; exit 0
fi
for g in ${FIT_GPUS:-$(seq 0 $((NGPU - 1)))}; do
  extra=FIT$g after=FIT_AFTER$g
  ( while [ -n "${!after:-}" ] && [ ! -e "${!after}" ]; do sleep 5; done  # e.g. GPU 1 after cuda_checks.sh
    CUDA_VISIBLE_DEVICES=$g python3 -m tfm_local.cli.train fit "${fit_args[@]}" --out ~/w/run$g ${!extra:-} \
      > ${ST:-~/st}/fit$g.log 2>&1 &&
    bash ~/repo/lab/gpu/pack.sh ~/w/run$g ${ST:-~/st}/run$g || touch ${ST:-~/st}/fit$g.failed ) &
done
wait
echo "$(date +%T) all done"; touch ${ST:-~/st}/all.done
