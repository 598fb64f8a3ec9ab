#!/usr/bin/env bash
# run_stage.sh NAME WAIT_SECONDS COMMAND: run COMMAND detached (once: a second call with the same NAME
# waits for the first run), logging to $ST/NAME.log and writing "rc N" to $ST/NAME.done; wait up to
# WAIT_SECONDS, then copy $ST/NAME.* and the results named in $COLLECT (globs under $ST) to $OUT and
# show the log's tail. A call that ends early loses nothing: call again to wait and collect.
set -uo pipefail
name=${1:?name}; wait_s=${2:?seconds}; cmd=${3:?command}
ST=${ST:-$HOME/st}; O=${OUT:-/tmp/out}; mkdir -p "$ST" "$O"
if [ ! -e "$ST/$name.pid" ]; then
  echo "$cmd" > "$ST/$name.cmd"
  setsid nohup bash -c "$cmd; echo rc \$? > $ST/$name.done" > "$ST/$name.log" 2>&1 < /dev/null &
  echo $! > "$ST/$name.pid"
fi
end=$((SECONDS + wait_s))
while [ ! -e "$ST/$name.done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
cp "$ST"/$name.* "$O"/ 2>/dev/null
for g in ${COLLECT:-}; do cp "$ST"/$g "$O"/ 2>/dev/null; done
[ -e "$ST/$name.done" ] && cat "$ST/$name.done" || echo "still running"
tail -c 6000 "$ST/$name.log"
