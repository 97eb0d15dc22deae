"""`infer-cluster status`'s replica table from the coordinator's own rows (`ReplicaRecord.
status_row`): the SPEC ACCEPTED column tells a replica that does not speculate ("-") from one
that speculates but has verified nothing yet ("0/0"), and shows the share it kept."""

from infer_cluster.cli_client import render_status
from infer_cluster.coordinator.registry import ReplicaRecord
from infer_cluster.protocol.payloads import ReplicaCapacity, ReplicaLoad


def _row(name: str, speculative: str, drafted: int = 0, accepted: int = 0) -> dict:
    cap = ReplicaCapacity(model="m", num_total_blocks=64, block_size=16, max_num_seqs=4,
                          max_model_len=256, speculative=speculative)
    load = ReplicaLoad(num_total_blocks=64, num_free_blocks=64, num_spec_draft_tokens=drafted,
                       num_spec_accepted_tokens=accepted)
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
