"""Every wire message round-trips, and every validation rule rejects with ProtocolError."""

from __future__ import annotations

import enum

import msgpack
import pytest

from infer_cluster.protocol import ProtocolError, RequestDelta, RequestMetrics, RequestOutput
from infer_cluster.protocol import codec
from infer_cluster.protocol import kinds
from infer_cluster.protocol.kinds import (ALL_KINDS, KIND_RANGES, PROTOCOL_VERSION, ConnectionKind, ControlKind,
                            LifecycleKind, ReplyKind, RequestKind)
from infer_cluster.protocol.messages import (MESSAGE_TYPES, AbortRequest, CancelRequest, ClientHello,
                               ControlReply, ControlRequest, DeltaPayload, DeltaReply,
                               DispatchRequest, Drain, ErrorInfo, ErrorReply, Goodbye, Heartbeat,
                               HeartbeatAck, Hello, HelloAck, Message, Pause, Ping, Pong,
                               ReplicaCapacity, ReplicaLoad, ReplicaStateChange, Reregister,
                               ResizeDone, ResizeKV, ResizeRequest, Resume, Shutdown,
                               StatusReply, StatusRequest, StepOutput, SubmitRequest)

CAP = ReplicaCapacity(model="tiny-random", num_total_blocks=10, block_size=16, max_num_seqs=4,
                      max_model_len=128)
DELTA = DeltaPayload(request_id="r1", token_ids=[1, 2, 3], text="abc",
                     logprobs=[[-0.5, {7: -1.25, 9: -2.0}, {1: b" a", 7: b"\xe4\xb8", 9: b""}]],
                     num_prompt_tokens=4)
FINAL = DeltaPayload(request_id="r2", finish_reason="error", error=ErrorInfo(code="engine", message="x"),
                     prompt_token_ids=[5, 6])

# One example per kind; the test below insists the table is complete.
EXAMPLES = {
    ConnectionKind.HELLO: Hello(replica_name="r0", capacity=CAP, pid=12, host="h", session="s1"),
    ConnectionKind.HELLO_ACK: HelloAck(coordinator="c", heartbeat_interval=0.25, num_replicas=2, model="m"),
    ConnectionKind.HEARTBEAT: Heartbeat(state="draining", load=ReplicaLoad(num_running=3, tokens_per_s=12.5)),
    ConnectionKind.HEARTBEAT_ACK: HeartbeatAck(),
    ConnectionKind.CLIENT_HELLO: ClientHello(client_name="cli"),
    ConnectionKind.PING: Ping(),
    ConnectionKind.PONG: Pong(),
    ConnectionKind.GOODBYE: Goodbye(reason="bye"),
    ConnectionKind.REREGISTER: Reregister(reason="who?"),
    RequestKind.SUBMIT: SubmitRequest(request_id="a", prompt="hi", sampling_params={"max_tokens": 3},
                                      priority=-2, timeout=1.5),
    RequestKind.CANCEL: CancelRequest(request_id="a"),
    RequestKind.DISPATCH: DispatchRequest(request_id="0.1", prompt_token_ids=[1, 2],
                                          sampling_params={"temperature": 0.0}, resume_token_ids=[4]),
    RequestKind.ABORT: AbortRequest(request_ids=["0.1", "3.2"]),
    ReplyKind.DELTA: DeltaReply(deltas=[DELTA, FINAL]),
    ReplyKind.STEP_OUTPUT: StepOutput(deltas=[DELTA], load=ReplicaLoad(num_free_blocks=5)),
    ReplyKind.ERROR: ErrorReply(code="protocol", message="bad", request_id="a"),
    ReplyKind.STATUS_REPLY: StatusReply(coordinator={"num_replicas": 1, "name": "c", "x": 1.5},
                                        replicas=[{"name": "r0", "state": "active"}]),
    ReplyKind.CONTROL_REPLY: ControlReply(ok=False, message="none", replicas=["r0"]),
    ControlKind.PAUSE: Pause(reason="op"),
    ControlKind.RESUME: Resume(),
    ControlKind.DRAIN: Drain(),
    ControlKind.SHUTDOWN: Shutdown(graceful=False, reason="now"),
    ControlKind.STATUS: StatusRequest(),
    ControlKind.CONTROL: ControlRequest(action="drain", replica="r0"),
    LifecycleKind.REPLICA_STATE: ReplicaStateChange(state="drained", reason="done"),
    ControlKind.RESIZE: ResizeRequest(replica="r0", num_kv_blocks=512, kv_cache_dtype="int8"),
    ControlKind.RESIZE_KV: ResizeKV(ticket="t1", num_kv_blocks=512),
    LifecycleKind.RESIZE_DONE: ResizeDone(ticket="t1", ok=True, message="now 512",
                                          capacity=ReplicaCapacity(model="m", num_total_blocks=512,
                                                                   kv_cache_dtype="int8"),
                                          load=ReplicaLoad(num_total_blocks=512, num_prefilling=1)),
}


def test_every_kind_has_a_struct_and_an_example():
    assert set(MESSAGE_TYPES) == set(ALL_KINDS)
    assert set(EXAMPLES) == set(ALL_KINDS)
    for kind, msg in EXAMPLES.items():
        assert MESSAGE_TYPES[kind] is type(msg)


@pytest.mark.parametrize("kind", list(EXAMPLES), ids=lambda k: k.name)
def test_round_trip(kind):
    msg = EXAMPLES[kind]
    payload = codec.encode(msg)
    back = codec.decode(payload)
    assert type(back) is type(msg)
    assert back == msg
    wire = msg.to_wire()
    assert wire["v"] == PROTOCOL_VERSION and wire["k"] == int(kind)
    assert type(msg).from_wire(wire) == msg


def test_kind_ranges_do_not_overlap_and_members_stay_in_range():
    for family, (lo, hi) in KIND_RANGES.items():
        assert all(lo <= m.value <= hi for m in family)
    numbers = [m.value for m in ALL_KINDS]
    assert len(numbers) == len(set(numbers))


def test_kind_table_check_catches_collisions(monkeypatch):
    class Clash(enum.IntEnum):
        X = 100  # inside RequestKind's range
    monkeypatch.setitem(KIND_RANGES, Clash, (150, 160))
    with pytest.raises(RuntimeError, match="overlap"):
        kinds._build_kind_table()


def test_kind_table_check_catches_out_of_range(monkeypatch):
    class Stray(enum.IntEnum):
        Y = 999
    monkeypatch.setitem(KIND_RANGES, Stray, (900, 950))
    with pytest.raises(RuntimeError, match="outside"):
        kinds._build_kind_table()


def test_delta_payload_converts_to_and_from_request_delta():
    d = RequestDelta(request_id="q", token_ids=[4], text="x", finish_reason="error",
                     error={"code": "engine", "message": "boom"}, num_prompt_tokens=3)
    p = DeltaPayload.from_delta(d, prompt_token_ids=[1, 2, 3])
    assert p.to_delta() == d
    assert p.prompt_token_ids == [1, 2, 3]


def test_metrics_reach_the_request_output_and_derive_queue_and_prefill_time():
    m = RequestMetrics(arrival_time=10.0, first_scheduled_time=10.25, first_token_time=11.0,
                       finish_time=12.5)
    d = RequestDelta(request_id="q", token_ids=[4], finish_reason="stop", metrics=m)
    back = DeltaPayload.from_dict(DeltaPayload.from_delta(d).to_dict(), "x").to_delta()
    assert back.metrics == m
    out = RequestOutput("q", [1])
    out.apply(RequestDelta(request_id="q", token_ids=[3]))
    assert out.metrics is None
    out.apply(back)
    assert out.metrics == m
    assert (m.queue_time, m.prefill_time, m.time_to_first_token) == (0.25, 0.75, 1.0)
    assert RequestOutput.from_dict(out.to_dict()) == out
    assert RequestMetrics(5.0).queue_time is None and RequestMetrics(5.0).prefill_time is None


def test_request_output_text_folds_deltas_and_reads_as_a_plain_field():
    out = RequestOutput("q", [1])
    assert out.text == "" and RequestOutput("q", [1], text="hi").text == "hi"
    for piece in ("The", "", " capital", " is"):
        out.apply(RequestDelta(request_id="q", token_ids=[7], text=piece))
    assert out.text == "The capital is" and out.token_ids == [7] * 4
    out.apply(RequestDelta(request_id="q", token_ids=[8], text=" Paris.", finish_reason="stop"))
    assert out == RequestOutput("q", [1], [7] * 4 + [8], "The capital is Paris.", "stop")
    assert "text='The capital is Paris.'" in repr(out)
    assert RequestOutput.from_dict(out.to_dict()).text == out.text
    out.text = "replaced"
    out.apply(RequestDelta(request_id="q", text="!"))
    assert out.text == "replaced!" and out.to_dict()["text"] == "replaced!"


def _wire(kind, **fields):
    return {"v": PROTOCOL_VERSION, "k": int(kind), **fields}


@pytest.mark.parametrize("data, match", [
    ([1, 2], "must be a map"),
    ({"k": 100}, "protocol version None"),
    ({"v": 99, "k": 100}, "protocol version 99"),
    ({"v": True, "k": 100}, "protocol version True"),
    ({"v": PROTOCOL_VERSION}, "kind must be an integer"),
    ({"v": PROTOCOL_VERSION, "k": "SUBMIT"}, "kind must be an integer"),
    ({"v": PROTOCOL_VERSION, "k": 777}, "unknown message kind 777"),
    (_wire(RequestKind.SUBMIT, prompt="x"), "missing the required field 'request_id'"),
    (_wire(RequestKind.SUBMIT, request_id="", prompt="x"), r"request_id must have 1\.\.256"),
    (_wire(RequestKind.SUBMIT, request_id="x" * 257, prompt="x"), r"1\.\.256"),
    (_wire(RequestKind.SUBMIT, request_id=5, prompt="x"), "request_id must be a string"),
    (_wire(RequestKind.SUBMIT, request_id="a"), "exactly one of"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", prompt_token_ids=[1]), "exactly one of"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt_token_ids=[1, -1]), "integers in 0"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt_token_ids=[1, 2.5]), "integers in 0"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt_token_ids="12"), "list of token ids"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", priority=True), "priority must be an integer"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", priority=2**40), "priority must be in"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", timeout=0), "timeout must be in"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", timeout=float("nan")), "finite"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", sampling_params=[1]), "must be a map"),
    (_wire(RequestKind.SUBMIT, request_id="a", prompt="x", sampling_params={1: 2}), "keys must be strings"),
    (_wire(RequestKind.ABORT, request_ids=["a", 3]), r"request_ids\[1\] must be a string"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "finish_reason": "bored"}]), "must be one of"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "error": {"code": "x"}}]), "no finish_reason"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas="nope"), "must be a list"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "logprobs": [[{(1, 2): 3}]]}]), "keys must be token ids"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "logprobs": [[-1.0, {}, {1: b"x" * 1025}]]}]),
     "1025 bytes for a token; at most 1024"),
    (_wire(ConnectionKind.HELLO, replica_name="r", capacity={"model": "m", "block_size": 0}), "block_size must be in"),
    (_wire(ConnectionKind.HELLO, replica_name="r"), "missing the required field 'capacity'"),
    (_wire(ConnectionKind.HEARTBEAT, state="sleepy"), "must be one of"),
    (_wire(ConnectionKind.HEARTBEAT, load={"num_running": -1}), "num_running must be in"),
    (_wire(ConnectionKind.HEARTBEAT, load={"spec_draft_tokens_per_position": [3, -1]}),
     r"spec_draft_tokens_per_position\[1\] must be in"),
    (_wire(ConnectionKind.HEARTBEAT, load={"spec_accepted_tokens_per_position": [0] * 65}), "at most 64"),
    (_wire(ControlKind.CONTROL, action="explode"), "must be one of"),
    (_wire(ControlKind.SHUTDOWN, graceful=1), "true or false"),
    (_wire(ControlKind.RESIZE, replica="r0"), "needs num_kv_blocks, kv_cache_dtype or both"),
    (_wire(ControlKind.RESIZE, replica="r0", num_kv_blocks=0), "num_kv_blocks must be in"),
    (_wire(ControlKind.RESIZE, replica="r0", kv_cache_dtype="fp4"), "must be one of"),
    (_wire(ControlKind.RESIZE_KV, ticket="t", num_kv_blocks=True), "must be an integer"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "metrics": {"first_token_time": 1.0}}]),
     "missing the required field 'arrival_time'"),
    (_wire(ReplyKind.STEP_OUTPUT, deltas=[{"request_id": "a", "metrics": {"arrival_time": -1.0}}]),
     "arrival_time must be in"),
])
def test_validation_errors_name_the_problem(data, match):
    with pytest.raises(ProtocolError, match=match):
        Message.from_wire(data)


def test_unknown_fields_are_ignored_for_forward_compatibility():
    msg = Message.from_wire(_wire(RequestKind.CANCEL, request_id="a", added_in_v2=[1, 2]))
    assert msg == CancelRequest(request_id="a")


def test_subclass_from_wire_checks_the_kind():
    with pytest.raises(ProtocolError, match="expected a CANCEL message, got SUBMIT"):
        CancelRequest.from_wire(SubmitRequest(request_id="a", prompt="x").to_wire())


def test_codec_frame_cap_on_both_sides():
    big = SubmitRequest(request_id="a", prompt="x" * 5000)
    with pytest.raises(ProtocolError, match="over the frame cap of 2048 bytes"):
        codec.encode(big, max_frame_bytes=2048)
    payload = codec.encode(big)
    with pytest.raises(ProtocolError, match="over the cap of 2048 bytes"):
        codec.decode(payload, max_frame_bytes=2048)


@pytest.mark.parametrize("payload, match", [
    (b"", "empty frame"),
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb([1, 2, 3]), "must be a msgpack map"),
    (msgpack.packb({"v": 1, "k": 6}) + b"\x00", "not valid msgpack"),
    (msgpack.packb({"v": 1, "k": 6})[:-1], "not valid msgpack"),
    (msgpack.packb(msgpack.ExtType(5, b"xx")), "extension type 5"),
    (b"\x81\xa1v\xc3", "protocol version True"),
    (msgpack.packb({"v": 1, "k": 100, "request_id": b"\xff", "prompt": "x"}, use_bin_type=True),
     "request_id must be a string"),
    (msgpack.packb({"v": 1, "k": 100, "request_id": "a", "prompt": b"\xff\xfe"}, use_bin_type=False),
     "not valid msgpack"),
    (None, "must be bytes"),
])
def test_codec_rejects_bad_bytes(payload, match):
    with pytest.raises(ProtocolError, match=match):
        codec.decode(payload)


def test_split_envelope():
    assert codec.split_envelope([b"id", b"", b"p"]) == ([b"id"], b"p")
    with pytest.raises(ProtocolError, match="empty delimiter"):
        codec.split_envelope([b"id", b"p"])
    with pytest.raises(ProtocolError, match="empty delimiter"):
        codec.split_envelope([b"id", b"x", b"p"])


def test_peek_request_id():
    assert codec.peek_request_id({"request_id": "abc"}) == "abc"
    assert codec.peek_request_id({"request_id": 3}) is None
    assert codec.peek_request_id(None) is None


@pytest.mark.parametrize("delta, prompt_ids", [
    (RequestDelta(request_id="a", token_ids=[1, 2], text="xy"), None),
    (RequestDelta(request_id="b", token_ids=[3], text="", logprobs=[[-1.0, {3: -1.0}]],
                  finish_reason="stop", num_prompt_tokens=4, num_cached_tokens=2), [9, 8, 7, 6]),
    (RequestDelta(request_id="d", token_ids=[5], finish_reason="length", num_prompt_tokens=40,
                  num_cached_tokens=16, num_cached_tokens_host=16), None),
    (RequestDelta(request_id="c", finish_reason="error", error={"code": "engine", "message": "x"}), []),
    (RequestDelta(request_id="f", finish_reason="error",
                  error={"code": "invalid_request", "message": "too long", "param": "prompt"}), None),
    (RequestDelta(request_id="d", token_ids=[5], finish_reason="length",
                  metrics=RequestMetrics(100.0, 100.5, 101.25, 103.0)), None),
    (RequestDelta(request_id="e", finish_reason="abort", metrics=RequestMetrics(100.0)), None),
])
def test_delta_wire_fast_path_equals_the_struct(delta, prompt_ids):
    from infer_cluster.protocol.messages import delta_wire
    assert delta_wire(delta, prompt_ids) == DeltaPayload.from_delta(delta, prompt_ids).to_dict()
    sent = codec.encode(StepOutput(deltas=[delta_wire(delta, prompt_ids)]))
    assert codec.decode(sent).deltas[0] == DeltaPayload.from_delta(delta, prompt_ids)
    assert codec.decode(sent).deltas[0].to_delta() == delta


def test_the_wire_holds_every_position_the_engine_may_propose():
    from infer_cluster.protocol.payloads import MAX_SPEC_POSITIONS
    from infer_cluster.worker.spec_decode.config import MAX_SPECULATIVE_TOKENS
    assert MAX_SPECULATIVE_TOKENS <= MAX_SPEC_POSITIONS
