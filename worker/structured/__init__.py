"""Structured outputs on the replica: the output of a request constrained to a JSON schema, any
JSON object, a regex, a choice of strings or an EBNF grammar, through xgrammar.

Owns: compiling a request's `StructuredOutputsParams` for the replica's tokenizer (`compiler`:
a small thread pool, a cache keyed by (kind, spec), bad specs as `InvalidRequestError` naming the
field), each request's matcher (`state.GrammarState`: advanced by the request's accepted tokens,
rebuilt from them when they no longer match) and the per-step token bitmask applied to the
constrained rows' logits (`bitmask.GrammarMasks`, the sampler's; a greedy draw at small batches
replays one CUDA graph, `mask_graphs`).
Sits beside worker/sampling/ (which calls into it) and imports nothing above it: no scheduler,
engine or runner. The engine attaches a `GrammarState` to each constrained request and defers
the draw of such a request's step (the mask of step n+1 needs the token of step n on the host;
the forward does not wait).
To extend with a kind: compile it in `compiler._compile` and add it to protocol/structured.py.
"""
