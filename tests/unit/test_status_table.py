"""`infer-cluster status`'s replica table from the coordinator's own rows (`ReplicaRecord.
status_row`): the SPEC ACCEPTED column tells a replica that does not speculate ("-") from one
that speculates but has verified nothing yet ("0/0"), and shows the share it kept; a line
under the table gives each speculating replica's acceptance by position in a row's proposals."""

from infer_cluster.cli_client import render_status
from infer_cluster.coordinator.registry import ReplicaRecord
from infer_cluster.protocol.payloads import ReplicaCapacity, ReplicaLoad


def _row(name: str, speculative: str, drafted: int = 0, accepted: int = 0,
         by_position: tuple = ((), ())) -> dict:
    cap = ReplicaCapacity(model="m", num_total_blocks=64, block_size=16, max_num_seqs=4,
                          max_model_len=256, speculative=speculative)
    load = ReplicaLoad(num_total_blocks=64, num_free_blocks=64, num_spec_draft_tokens=drafted,
                       num_spec_accepted_tokens=accepted,
                       spec_draft_tokens_per_position=list(by_position[0]),
                       spec_accepted_tokens_per_position=list(by_position[1]))
    rec = ReplicaRecord(key=name.encode(), name=name, capacity=cap, index=0, load=load,
                        last_seen=10.0)
    return rec.status_row(now=10.5)


def _spec_cell(table: str, name: str) -> str:
    header = table.splitlines()[3]
    line = next(x for x in table.splitlines() if x.startswith(name))
    start = header.index("SPEC ACCEPTED")
    return line[start:header.index("LAST SEEN")].strip()


def test_spec_column_tells_off_from_idle_and_shows_the_share():
    rows = [_row("plain", ""), _row("idle", "ngram"), _row("busy", "draft_model", 40, 30)]
    assert [r["speculative"] for r in rows] == ["", "ngram", "draft_model"]
    table = render_status({"coordinator": {}, "replicas": rows})
    assert _spec_cell(table, "plain") == "-"
    assert _spec_cell(table, "idle") == "0/0"
    assert _spec_cell(table, "busy") == "30/40 (75%)"


def test_an_older_replica_without_the_field_reads_as_not_speculating():
    row = _row("old", "")
    del row["speculative"]
    assert _spec_cell(render_status({"coordinator": {}, "replicas": [row]}), "old") == "-"


def test_acceptance_by_position_under_the_table():
    rows = [_row("plain", ""), _row("idle", "ngram", by_position=([0, 0], [0, 0])),
            _row("busy", "ngram", 30, 17, by_position=([16, 10, 4, 0], [12, 5, 0, 0]))]
    lines = render_status({"coordinator": {}, "replicas": rows}).splitlines()
    assert lines[-1] == "busy: speculative acceptance by position 75% 50% 0% -"
    assert not any(x.startswith(("plain:", "idle:")) for x in lines)  # nothing verified there
