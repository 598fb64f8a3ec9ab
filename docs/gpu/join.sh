#!/usr/bin/env bash
# Join the carried pieces of the target into ~/w/model.gguf and check its sha256.
# usage: join.sh SHA256
set -euo pipefail
cat ~/xfer/m.* > ~/w/model.gguf
echo "$1  $HOME/w/model.gguf" | sha256sum -c -
rm -f ~/xfer/m.*
