"""bench/ncu_profile.py's parsing of Nsight Compute exports (no GPU, no ncu)."""

import pytest

from bench.ncu_profile import details, sass_rows, summarize

DETAILS = """  _decode_kernel (256, 8, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Throughput                   %        61.69
    L2 Cache Throughput               %        83.10
    Duration                         us       188.80
    Issue Slots Busy               %        31.16
    Registers Per Thread             register/thread               160
"""

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
          '"L1 Wavefronts Shared","L1 Wavefronts Shared Excessive","stall_long_sb",'
          '"stall_short_sb","stall_long_sb (Not Issued)"')
SASS = ['"Kernel Name","_decode_kernel",', HEADER,
        '"0x7f00","      BAR.SYNC.DEFER_BLOCKING 0x0","30","100","0","0","28","2","20"',
        '"0x7f10","      STS.128 [R67+UR11], R44","5","100","8","4","0","5","0"',
        '"0x7f20","      @!P5  LDG.E R120, desc[UR24][R44.64]","15","50","0","0","10","5","8"',
        '"0x7f30","      HMMA.16816.F32 R56, R48, R28, R56","50","250","0","0","0","50","0"']


def test_details_reads_labelled_values():
    info = details(DETAILS)
    assert info["DRAM Throughput"] == "61.69 %"
    assert info["Duration"] == "188.80 us"
    assert info["L2 Cache Throughput"] == "83.10 %"
    assert info["Registers Per Thread"] == "160 register/thread"
    assert "Memory Throughput" not in info


def test_summary_shares_opcodes_conflicts_and_hot_rows():
    rows = sass_rows(SASS)
    assert len(rows) == 4
    s = summarize(rows, top=2)
    assert s["samples"] == 100
    assert s["stalls"] == pytest.approx({"short_sb": 0.62, "long_sb": 0.38})
    ops = {op: (share, ex) for op, share, ex in s["opcodes"]}
    assert ops["HMMA"] == pytest.approx((0.5, 0.5))
    assert ops["LDG"] == pytest.approx((0.15, 0.1))  # the predicate is not the opcode
    assert [c["sass"] for c in s["conflicts"]] == ["STS.128 [R67+UR11], R44"]
    assert [(h[1][:4], h[3]) for h in s["hot"]] == [("HMMA", "short_sb"), ("BAR.", "long_sb")]


def test_sass_rows_needs_the_header():
    with pytest.raises(ValueError, match="no SASS header"):
        sass_rows(['"Kernel Name","x",', '"a","b"'])
