"""The `infer-cluster` commands that act as a client: `status`, `control`, `generate`, `bench`.

Owns: argument handling and terminal output for those commands. The work is in
`client/` (talking to a coordinator), `coordinator/loadgen.py` (bench) and, for `generate`
without --address, the offline `worker.LLM` behind a lazy import (the only place this module
may load torch, and only when asked to run the engine in-process).
"""

from __future__ import annotations

import json
import sys

import click

from infer_cluster.protocol import InferClusterError, SamplingParams

from .cli_options import (DEFAULT_MODEL, CliError, auth_option, check_device, check_model, engine_options,
                          given_engine_options, typed_engine_options)

DEFAULT_ADDRESS = "tcp://127.0.0.1:5555"
address_option = click.option("--address", default=DEFAULT_ADDRESS, show_default=True,
                              help="the coordinator's client address")


CONNECT_TIMEOUT = 3.0  # a CLI command gives up on a silent address after this (plus its start-up)


def _client(address: str, auth=None, roles=("client", "admin")):
    """A connected-on-demand client, or a one-line error (bad address, unusable key folder)."""
    from infer_cluster.client import InferenceClient
    from infer_cluster.client.auth import load_keys
    try:
        role = load_keys(auth).pick_role(roles) if auth else None
        return InferenceClient(address, name="cli", auth=auth, auth_role=role,
                               connect_timeout=CONNECT_TIMEOUT)
    except ValueError as exc:  # AuthError is one
        raise CliError(f"error: {exc}") from None


def _call(fn, *args, **kwargs):
    """A client call whose failure (timeout, unreachable) is one line."""
    try:
        return fn(*args, **kwargs)
    except (TimeoutError, InferClusterError) as exc:
        raise CliError(f"error: {exc}") from None


def _fmt_row(cols, widths) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cols, widths)).rstrip()


def _host_kv(row: dict) -> str:
    """The host KV tier's column: blocks used of total, and prompt tokens it served."""
    total = row.get("num_host_blocks") or 0
    if not total:
        return "off"
    return (f"{row.get('num_host_used_blocks', 0)}/{total} blk, "
            f"{row.get('prefix_cache_hit_tokens_host', 0)} hit tok")


def _spec(row: dict) -> str:
    """Speculative decoding's column: proposed tokens the replica kept, of those it verified
    ("0/0" while a speculating replica has verified none; "-" when it does not speculate)."""
    drafted = row.get("num_spec_draft_tokens") or 0
    if not drafted:
        return "0/0" if row.get("speculative") else "-"
    accepted = row.get("num_spec_accepted_tokens", 0)
    return f"{accepted}/{drafted} ({100 * accepted / drafted:.0f}%)"


def render_status(status: dict) -> str:
    c = status["coordinator"]
    lines = [
        f"coordinator {c.get('front_address')}  model {c.get('model') or '-'}  routing "
        f"{c.get('routing')}  up {c.get('uptime_s', 0):.0f}s{'  DRAINING' if c.get('is_draining') else ''}",
        f"requests: {c.get('num_in_flight', 0)} in flight ({c.get('num_pending', 0)} pending), "
        f"{c.get('num_completed', 0)} completed, {c.get('num_failed', 0)} failed, "
        f"{c.get('num_refused', 0)} refused by a replica (invalid, or too large), "
        f"{c.get('num_aborted', 0) + c.get('num_client_gone_aborts', 0)} aborted, "
        f"{c.get('num_timeouts', 0)} timed out, {c.get('num_rejected', 0)} rejected; "
        f"re-routes {c.get('num_reroutes', 0)} ({c.get('num_resumed', 0)} resumed), "
        f"replica deaths {c.get('num_replica_deaths', 0)}, departures {c.get('num_replica_departures', 0)}",
        "",
    ]
    header = ["NAME", "STATE", "HOST", "PID", "REQS", "RUNNING", "WAITING", "KV USED", "HOST KV",
              "TOK/S", "GENERATED", "SPEC ACCEPTED", "LAST SEEN"]
    rows = [[r.get("name"), r.get("state"), r.get("host"), r.get("pid"), r.get("num_requests"),
             r.get("num_running"), r.get("num_waiting"),
             f"{100 * r.get('kv_used', 0):.1f}% of {r.get('num_total_blocks')}"
             + (f" {r['kv_cache_dtype']}" if r.get("kv_cache_dtype", "auto") != "auto" else ""),
             _host_kv(r),
             f"{r.get('tokens_per_s', 0):.1f}", r.get("num_generated_tokens"), _spec(r),
             f"{r.get('seconds_since_seen', 0):.1f}s ago"] for r in status["replicas"]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    lines.append(_fmt_row(header, widths))
    lines += [_fmt_row(r, widths) for r in rows]
    if not rows:
        lines.append("(no replicas registered)")
    lines += [line for r in status["replicas"] if (line := _spec_by_position(r))]
    return "\n".join(lines)


def _spec_by_position(row: dict) -> str:
    """A speculating replica's acceptance at each position of a row's proposals (the first
    proposal, the second, ...): where it falls off, a smaller k would verify less for nothing.
    "" for a replica that has verified nothing."""
    drafted = row.get("spec_draft_tokens_per_position") or []
    if not any(drafted):
        return ""
    accepted = row.get("spec_accepted_tokens_per_position") or []
    rates = [f"{100 * a / d:.0f}%" if d else "-" for a, d in zip(accepted, drafted)]
    return f"{row.get('name')}: speculative acceptance by position {' '.join(rates)}"


@click.command()
@address_option
@click.option("--json", "as_json", is_flag=True, help="print the raw status as JSON")
@click.option("--timeout", default=4.0, show_default=True, type=float)
@auth_option
def status(address, as_json, timeout, auth):
    """Show the coordinator and a table of replicas: state, load, KV use, tokens/s, and the
    speculative proposals each kept (accepted of verified; 0/0 before its first verify step; -
    when it does not speculate), then each speculating replica's acceptance by position in a
    row's proposals."""
    with _client(address, auth) as c:
        st = _call(c.status, timeout=timeout)
    click.echo(json.dumps(st, indent=2) if as_json else render_status(st))


@click.command()
@click.argument("action", type=click.Choice(["pause", "resume", "drain", "shutdown", "resize"]))
@click.option("--replica", default=None, help="replica name (default: every replica; resize: required)")
@click.option("--blocks", type=int, default=None,
              help="resize: the new number of KV blocks (at least one max-length request's worth)")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "int8"]), default=None,
              help="resize: the new KV storage; without --blocks the pool keeps its bytes")
@click.option("--timeout", default=130.0, show_default=True, type=float,
              help="resize: seconds to wait for the replica's answer")
@address_option
@auth_option
def control(action, replica, blocks, kv_cache_dtype, timeout, address, auth):
    """Pause, resume, drain, shut down or resize replicas through the coordinator.

    `resize --replica R --blocks N` (and/or `--kv-cache-dtype int8|auto`) gives one replica a
    new KV pool between two of its steps: running requests that do not fit go back to waiting
    and are recomputed, none fails; the new size shows in `status` and weighs in routing.

    With auth on, only the admin key may do this (`--auth` with a folder holding
    admin.key_secret: the full folder or `keygen DIR --export admin OUT`)."""
    if action == "resize":
        if replica is None:
            raise CliError("error: resize needs --replica NAME (see `infer-cluster status`)")
        if blocks is None and kv_cache_dtype is None:
            raise CliError("error: resize needs --blocks N, --kv-cache-dtype auto|int8, or both")
        if blocks is not None and blocks <= 0:
            raise CliError(f"error: --blocks must be a positive integer, got {blocks}")
    elif blocks is not None or kv_cache_dtype is not None:
        raise CliError(f"error: --blocks / --kv-cache-dtype apply to resize, not {action}")
    with _client(address, auth, roles=("admin", "client")) as c:
        if action == "resize":
            reply = _call(c.resize, replica, blocks, kv_cache_dtype, timeout=timeout)
        else:
            reply = _call(c.control, action, replica, timeout=4.0)
    if not reply["ok"]:
        raise CliError(f"error: {reply['message']}")
    if action == "resize":
        click.echo(reply["message"])
    else:
        click.echo(f"{reply['message']}: {', '.join(reply['replicas'])}")


def _sampling(max_tokens, temperature, top_p, top_k, seed, stop, ignore_eos) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                              top_k=top_k, seed=seed, stop=list(stop), ignore_eos=ignore_eos)
    except InferClusterError as exc:
        raise CliError(f"error: {exc}") from None


@click.command()
@click.argument("prompts", nargs=-1, required=True)
@click.option("--address", default=None,
              help="stream through this coordinator; without it the engine runs in-process")
@click.option("--max-tokens", default=32, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=0, show_default=True, type=int)
@click.option("--sampling-seed", default=None, type=int, help="per-request sampling seed")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--ignore-eos", is_flag=True)
@click.option("--chat", "as_chat", is_flag=True,
              help="send each PROMPT as a user message, rendered with the model's chat template")
@auth_option
@engine_options
def generate(prompts, address, max_tokens, temperature, top_p, top_k, sampling_seed, stop,
             ignore_eos, as_chat, auth, **kw):
    """Generate text for PROMPTS. One prompt streams to the terminal; several print in order.

    Without --address the engine runs in this process (engine flags apply; the model defaults
    to the embedded SmolLM2-135M-Instruct); with --address the request goes through a running
    cluster. --chat asks the model as a chat assistant:

        infer-cluster generate --chat "What is the capital of France?"
    """
    params = _sampling(max_tokens, temperature, top_p, top_k, sampling_seed, stop, ignore_eos)
    engine = given_engine_options(kw)
    try:
        if address is None:
            source = click.get_current_context().get_parameter_source("auth")
            if auth and source is click.core.ParameterSource.COMMANDLINE:
                raise CliError("error: --auth applies to a cluster; add --address, or drop "
                               "--auth to run the engine in this process")
            _generate_offline(list(prompts), params, typed_engine_options(engine), as_chat)
        else:
            if engine:
                click.echo(f"note: engine options ({', '.join(engine)}) are ignored with "
                           "--address; the replicas were started with their own", err=True)
            _generate_online(address, list(prompts), params, auth, as_chat)
    except InferClusterError as exc:
        raise CliError(f"error: {exc}") from None


def _print_outputs(prompts, outputs) -> None:
    for i, (p, out) in enumerate(zip(prompts, outputs)):
        click.echo(f"[{i}] {p!r} -> {out.text!r} ({out.finish_reason}, {len(out.token_ids)} tokens)")


def _user_turn(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _generate_online(address, prompts, params, auth, as_chat=False) -> None:
    with _client(address, auth) as c:
        if len(prompts) == 1:
            handle = (c.chat(_user_turn(prompts[0]), params) if as_chat
                      else c.submit(prompts[0], params))
            for delta in handle.stream():
                click.echo(delta.text, nl=False)
                sys.stdout.flush()
            click.echo()
            handle.result()  # raises the typed error if it failed
            return
        if as_chat:
            outs = [h.result() for h in [c.chat(_user_turn(p), params) for p in prompts]]
        else:
            outs = c.generate(prompts, params)
        _print_outputs(prompts, outs)
        failed = [o for o in outs if o.finish_reason == "error"]
        if failed:
            raise CliError(f"error: {len(failed)} request(s) failed: {failed[0].error}")


def _generate_offline(prompts, params, engine, as_chat=False) -> None:
    engine.setdefault("model", DEFAULT_MODEL)
    check_model(engine)
    check_device(engine)
    from infer_cluster.worker import LLM  # loads torch: this form runs the engine here
    llm = LLM(**engine)
    if len(prompts) > 1:
        outs = (llm.chat([_user_turn(p) for p in prompts], params, use_tqdm=True) if as_chat
                else llm.generate(prompts, params, use_tqdm=True))
        _print_outputs(prompts, outs)
        return
    if as_chat:
        from infer_cluster.worker.text.chat import render_chat
        rid = llm.add_request(render_chat(llm.tokenizer, _user_turn(prompts[0])), params)
    else:
        rid = llm.add_request(prompts[0], params)
    while llm.has_unfinished_requests():
        for delta in llm.step():
            if delta.request_id != rid:
                continue
            click.echo(delta.text, nl=False)
            sys.stdout.flush()
            if delta.finished and delta.finish_reason == "error":
                raise CliError(f"\nerror: {(delta.error or {}).get('message', 'request failed')}")
    click.echo()


def _range(text: str, name: str) -> tuple[int, int]:
    from infer_cluster.loadgen import parse_range
    try:
        return parse_range(text)
    except ValueError:
        raise CliError(f"error: --{name} must be N or LO:HI, got {text!r}") from None


@click.command()
@address_option
@click.option("--num-requests", "-n", default=200, show_default=True, type=int)
@click.option("--concurrency", default=None, type=int, help="cap on requests in flight")
@click.option("--request-rate", default=None, type=float,
              help="Poisson arrivals per second (default: all at once)")
@click.option("--input-len", default="16:64", show_default=True, help="prompt tokens, N or LO:HI")
@click.option("--output-len", default="16:64", show_default=True, help="output tokens, N or LO:HI")
@click.option("--token-id-range", default="10:500", show_default=True,
              help="prompt token ids are drawn from LO:HI (must be inside the vocabulary)")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_path", default=None, help="also write the summary to this file")
@click.option("--http", "http_url", default=None,
              help="also drive the same workload through the HTTP gateway at this URL "
                   "(e.g. http://127.0.0.1:8000) and report what the gateway adds over ZMQ")
@click.option("--repeat", default=1, show_default=True, type=int,
              help="with --http: alternate ZMQ and HTTP runs this many times (pooled results)")
@click.option("--api-key", default=None, envvar="INFER_CLUSTER_API_KEY", metavar="KEY",
              help="with --http: the gateway's API key (sent as 'Authorization: Bearer KEY'). "
                   "Env: INFER_CLUSTER_API_KEY")
@auth_option
def bench(address, num_requests, concurrency, request_rate, input_len, output_len,
          token_id_range, seed, json_path, http_url, repeat, api_key, auth):
    """Online load through a running cluster: TTFT / TPOT / end-to-end p50 and p99.

    With --http URL the workload runs through ZMQ (InferenceClient) and through the gateway's
    /v1/completions (streaming) against the same cluster, and a table shows the difference."""
    from .loadgen import Workload, format_table, run_load, summarize
    try:
        work = Workload(num_requests=num_requests, input_len=_range(input_len, "input-len"),
                        output_len=_range(output_len, "output-len"),
                        token_id_range=_range(token_id_range, "token-id-range"), seed=seed)
    except ValueError as exc:
        raise CliError(f"error: {exc}") from None
    if http_url is not None:
        from .loadgen_http import bench_both
        summary = bench_both(address, http_url, work, concurrency, request_rate, seed, repeat,
                             auth=auth, api_key=api_key)
        if json_path:
            with open(json_path, "w") as f:
                json.dump(summary, f, indent=2)
        return
    with _client(address, auth) as c:
        _call(c.status, timeout=4.0)
        result = run_load(c, work.build(), concurrency=concurrency, request_rate=request_rate,
                          progress=True, seed=seed)
    summary = summarize(result)
    summary.update({"address": address, "concurrency": concurrency, "request_rate": request_rate})
    click.echo(format_table(summary, title="infer-cluster bench"))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(summary, f, indent=2)
