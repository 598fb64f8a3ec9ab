#!/usr/bin/env bash
# Build upstream llama.cpp's llama-speculative-simple (CUDA, sm_90) from the pinned sdist that
# cuda_build.sh joined, with our patch 0002 only (the pinned qwen2 graph lacks the layer inputs
# DFlash reads), into ~/up/b/bin. Run in the background after cuda_build.sh; ${ST:-~/st}/up.done at the end.
set -uo pipefail
S=~/.cache/tfm-local/sdist/llama_cpp_python-0.3.36.tar.gz
rm -rf ~/up && mkdir -p ~/up && tar xzf $S -C ~/up --strip-components=1 llama_cpp_python-0.3.36/vendor/llama.cpp &&
  cd ~/up && patch -p1 < ~/repo/ggml_ops/patches/0002-layer-inputs-qwen2-gemma3.patch > ${ST:-~/st}/up.log 2>&1 &&
  CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ cmake -S vendor/llama.cpp -B b -G Ninja -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release >> ${ST:-~/st}/up.log 2>&1 &&
  nice -n 19 cmake --build b -j ${JOBS:-20} --target llama-speculative-simple >> ${ST:-~/st}/up.log 2>&1 &&
  touch ${ST:-~/st}/up.done || touch ${ST:-~/st}/up.failed
