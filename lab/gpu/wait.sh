#!/usr/bin/env bash
# wait.sh SECONDS FILE...: sleep until every FILE exists or SECONDS pass; then a status report.
t=$1; shift
end=$((SECONDS + t))
while [ $SECONDS -lt $end ]; do
  ok=1; for f in "$@"; do [ -e "$f" ] || ok=0; done
  [ $ok = 1 ] && break; sleep 5
done
date +%T; ls ${ST:-~/st}
for f in ${ST:-~/st}/gen*.log ${ST:-~/st}/fit*.log ${ST:-~/st}/build.log ${ST:-~/st}/cuda/tests.log; do
  [ -e "$f" ] && { echo "== $f"; tail -c 400 "$f" | tr '\r' '\n' | tail -3; }
done
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
