"""`CurrentStream` / `StreamRecorder` (worker/device/streams.py): an event recorded through
them lands on the stream that is current at the call, the default one or one entered with
`torch.cuda.stream`, and a wait on it covers the work queued there before the record."""

import pytest
import torch

from infer_cluster.worker.device.streams import CurrentStream, StreamRecorder

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def test_the_cached_stream_follows_the_current_one():
    device = torch.device("cuda", torch.cuda.current_device())
    current = CurrentStream(device)
    default = current.get()
    assert default == torch.cuda.current_stream(device)
    assert current.get() is default  # cached while it stays current
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        assert current.get() == side
    assert current.get() == default


def test_a_recorded_event_covers_the_work_before_it_on_a_side_stream():
    device = torch.device("cuda", torch.cuda.current_device())
    recorder = StreamRecorder()
    side = torch.cuda.Stream(device)
    x = torch.zeros(1 << 22, device=device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~tens of ms on the side stream
        x.fill_(3.0)
        event = recorder.recorded(device)
    assert not event.query()  # recorded on the side stream, behind its sleep
    event.synchronize()
    side.synchronize()
    assert float(x[0]) == 3.0 and float(x[-1]) == 3.0
