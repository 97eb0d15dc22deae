"""Speculative decoding: proposals for several next tokens of a request, verified by one forward.

Owns: `SpeculativeConfig` (`config.py`: the user's dict or JSON, validated, and the engine
settings it cannot run with yet), the n-gram prompt-lookup proposer (`ngram.py`: plain Python),
the draft-model proposer (`draft.py`: greedy proposals from a small model over its own KV pool
under the target's block ids; its runner is built by the engine, worker/engine/draft.py),
and verification (`verify.py`: a step whose decode rows carry proposals computes logits at each
of their k + 1 positions, the sampler draws every position as if the proposals were the
request's tokens, and the longest prefix of proposals that equals the draws is accepted, plus
the first draw that differs), when to speculate (`governor.py`: per batch size, from measured
step times and acceptance; `shadow.py`: the acceptance plain steps would have had). The
scheduler's side (proposals scheduled as extra positions of a
decode row, rejected positions and their blocks given back) is in worker/sched/ (`Request`
`spec_token_ids`, `Scheduler.update_verified`); the engine wires it in (worker/engine/engine.py).
See docs/spec_decode.md.

Layering: sits beside worker/sampling/ and may import it, worker/sched/, device/, text/ and
kernels/; never the engine, runner or serving (the engine hands this package its runner and
sampler). `config.py` never imports torch (the CLI validates configs without it).
To extend with a method: add it to `config.METHODS`, give it a proposer with
`propose(requests)` (and `fill(out, requests)` if it needs the scheduled positions; `shadow(req,
batch)` if it can propose without a forward: shadow acceptance and `worth_waiting` ask it), and keep
verification as it is: it never looks at where proposals came from.
"""
