# Sourced by the stage scripts (sampling.sh, steps.sh) from the call's checkout: the environment
# setup.sh wrote, this checkout first on the path, $ST, the shipped drafter copied in from call 1's
# transfer (too large to carry with every call) and $T, the joined default target.
. ~/env.sh
export PYTHONPATH=$HOME/llama:$HOME/site:$PWD
ST=${ST:-$HOME/st}; mkdir -p "$ST"
D=qwen2.5-coder-1.5b-instruct.dflash-L3-q4_0.novocab.gguf
[ -e tfm_local/assets/$D ] || cp ~/xfer/$D tfm_local/assets/$D 2>/dev/null
T=~/w/model.gguf
