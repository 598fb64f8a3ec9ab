"""Time ggml_top_k on the GPU over vocabulary-long rows (docs/gpu.md, "ggml_top_k on the GPU").

Run twice on a CUDA build of the patched library, the second time with the sort path forced (which needs
ggml_ops/dev/cuda-top-k-sort-switch.patch applied on top of the series):

    python lab/measure_top_k.py
    TFM_CUDA_TOP_K_SORT=1 python lab/measure_top_k.py

Each line: rows x 151,936 random columns, k, median and min of 50 timed one-op graphs
(``op_harness.bench_op``: compute + synchronize, after 5 warm-ups).
"""
import os

import numpy as np

from tfm_local.testing import op_harness

tag = "sort" if os.environ.get("TFM_CUDA_TOP_K_SORT") else "small-k"
for rows in (1, 15, 64):
    x = np.random.default_rng(rows).standard_normal((rows, 151936)).astype(np.float32)
    for k in (1, 8, 32):
        ms = op_harness.bench_op("top_k", [x], iparam=k, device="gpu", n_warmup=5, n_iter=50)
        print(f"top_k {tag:8s} rows {rows:3d} k {k:2d}: median {np.median(ms):.4f} ms  min {ms.min():.4f}", flush=True)
