"""Scheduling as plain Python over ints and lists: `Scheduler`, `Request`, `BlockAllocator`
(ref counts, free list, xxhash prefix cache), admission, the host-tier book, micro-batch sizing,
and `SchedulerOutput`, the one object the runner sees.

Never imports torch: every file here is unit-tested on exact block ids without a device.
"""
