"""The device's ground floor: page-locked and device-mapped host memory, uploads of host values
to the device (mapped reads or pinned DMA), and waits on device events that do not spin a core.

Used by kv/, runner/, sampling/ and distributed/; imports nothing of the worker.
"""
