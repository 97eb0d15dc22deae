"""`GrammarCompilerPool`: compiles `StructuredOutputsParams` with xgrammar for one tokenizer.

Owns: the xgrammar `TokenizerInfo` of the replica's tokenizer (built on first use, with the
engine's EOS ids as the grammar's stop tokens), a `GrammarCompiler`, a thread pool of `num_threads` workers and a
bounded cache of compiled grammars (futures) keyed by `StructuredOutputsParams.cache_key()`.
A spec is parsed on the caller's thread (`xgrammar.Grammar`, no vocabulary work: ~1 ms), so a
spec that xgrammar refuses is an `InvalidRequestError` naming the field before the request is
queued; the compile against the tokenizer (the first one also builds `TokenizerInfo`, ~0.5 s for
a 49k vocabulary) runs on the pool. A failed compile leaves the cache, so a retry compiles
again. Never touches tensors.

The `TokenizerInfo` covers the tokenizer's own ids (`grammar_vocab_size`), not a model's LM head
padded past them: xgrammar counts every id without text as a special token and checks each of
them on every accepted token and every mask, so SmolLM2's tokenizer (49,152 ids) over a
151,936-row head took 20 us an accept and 0.16 ms a row's mask, against 1.3 us and 0.01 ms over
its own ids (2-core CPU, 2026-11-29). The ids past it are never allowed: the sampler sets them to
-inf on constrained rows (worker/structured/bitmask.py).

JSON output is compact (xgrammar's `any_whitespace=False`: ", " and ": " separators, no
newlines): a free-whitespace grammar lets a small model spend its whole budget on spaces.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional, Sequence

from infer_cluster.protocol import InvalidRequestError
from infer_cluster.protocol.structured import StructuredOutputsParams

_CACHE_SIZE = 512
_XGR_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\S+:\d+:\s*")  # "[16:37:03] /project/cpp/x.cc:94: "


def choice_grammar(choices: Sequence[str]) -> str:
    """EBNF whose root is exactly one of `choices` (each a quoted literal)."""
    return "root ::= " + " | ".join(_literal(c) for c in choices)


def _literal(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _clean(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return _XGR_PREFIX.sub("", text[0]) if text else type(exc).__name__


class GrammarCompilerPool:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int],
                 num_threads: int = 2, cache_size: int = _CACHE_SIZE):
        self._tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self._stop_ids = [int(t) for t in stop_token_ids]
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="grammar")
        self._lock = threading.Lock()  # the cache, and building the compiler once
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._compiler = None
        self._cache_limit = cache_size
        self.num_compiled = 0  # compiles run (cache misses), for stats and tests

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A future of the compiled grammar: the cached one, or a compile queued on the pool.
        The spec is parsed here first (fast, no vocabulary work): a bad one raises
        `InvalidRequestError` naming the field at once; the compile against the tokenizer runs
        on the pool (its rare failure is the future's `InvalidRequestError`)."""
        key = params.cache_key()
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None:
                self._cache.move_to_end(key)
                return fut
        grammar = _parse(params)
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._pool.submit(self._compile, params.kind, grammar)
                self._cache[key] = fut
                while len(self._cache) > self._cache_limit:
                    self._cache.popitem(last=False)
        fut.add_done_callback(lambda f, k=key: self._forget_failed(k, f))
        return fut

    def compile(self, params: StructuredOutputsParams, timeout: Optional[float] = None):
        """The compiled grammar (waits for the pool); raises `InvalidRequestError`."""
        return self.submit(params).result(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _forget_failed(self, key: str, fut: Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            with self._lock:
                if self._cache.get(key) is fut:
                    del self._cache[key]

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr
                size = grammar_vocab_size(self._tokenizer, self.vocab_size)
                stops = [t for t in self._stop_ids if t < size]
                info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=size,
                                                          stop_token_ids=stops or None)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _compile(self, kind: str, grammar):
        compiler = self._get_compiler()
        self.num_compiled += 1
        try:
            return compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InvalidRequestError(f"structured_outputs.{kind} cannot be compiled: {_clean(exc)}",
                                      param=f"structured_outputs.{kind}") from None


def grammar_vocab_size(tokenizer, model_vocab_size: int) -> int:
    """The ids a grammar's mask covers: the tokenizer's (its highest id + 1, added tokens
    included), at most the model's vocabulary."""
    vocab = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values()) + 1 if vocab else 0)
    return min(int(model_vocab_size), size)


def _parse(params: StructuredOutputsParams):
    """The spec as an xgrammar `Grammar` (tokenizer-free); `InvalidRequestError` naming the
    field when xgrammar refuses it."""
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            return xgr.Grammar.from_json_schema(params.json, any_whitespace=False)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema(json.dumps({"type": "object"}), any_whitespace=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_grammar(params.choice))
        return xgr.Grammar.from_ebnf(params.grammar)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise InvalidRequestError(f"structured_outputs.{kind} cannot be compiled: {_clean(exc)}",
                                  param=f"structured_outputs.{kind}") from None
