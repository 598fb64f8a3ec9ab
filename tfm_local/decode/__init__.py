"""One decode step, one module per stage, in the order a step runs them (``step.run_step`` drives them,
the engine calls it once per step):

- ``draft``    the DFlash drafter: target features injected into its KV cache, one block pass,
               the chain or the top-K marginals per block position (``DFlashDrafter``)
- ``tree``     the draft tree (``Tree``) and its builders from the marginals: chain, DDTree, w-wide
- ``methods``  the drafting methods, one object each, turning the drafter's pass into a ``Tree``
               (chain, DDTree and w-wide, TfM, DARTree, DFlash2's lattice tree; ``methods.make_method``)
- ``lattice``  a DFlash2 drafter's selector lattice: greedy and sampled walks, best-first lattice trees,
               the selector as DARTree's path scorer
- ``verify``   the target: prefill, one-pass verification of a tree (a chain is a tree) giving the
               target's choice per node, commit of the accepted path, layer features (``Target``)
- ``verdict``  what a verification returns: the tree's shape checked, the logits rows in node order,
               each node's choice (``Verdict``)
- ``accept``   the lossless acceptance walk over the verified tree
- ``step``     one step, draft → tree → verify → accept → commit, and the ``StepRecord`` it returns
- ``budget``   the automatic budget: how many drafted tokens to verify per step, from measured costs
- ``weaver``   the Weaver on the backend (TfM's and DARTree's scorer of the candidates along a path)
- ``prompt_cache`` what a generation keeps of the caches the last one left (the longest common token
               prefix, within the rules of recurrent and sliding-window caches and the drafter's rows)
- ``warmup``   every pass shape the budget may choose run once at load (GPU), so that no timed step is cold
- ``sampling`` the target's processed distribution and the draw (temperature, top-k, top-p, min-p)
- ``penalties`` frequency, presence and repeat penalties on the target's logits (``Penalties``)
- ``logprobs`` an emitted token's log-probability and its most likely alternatives (``TokenLogprob``)
- ``grammar``  a GBNF grammar over the target's vocabulary (llama.cpp's matcher): the tokens it allows,
               the drafts it rejects cut; ``json_grammar`` for JSON objects and schemas
- ``host_choice`` the token choice on the host with penalties, a grammar and log-probability records
               (``HostChooser``)
- ``stats``    per-generation counters and the time split (``GenerationStats``)
"""
