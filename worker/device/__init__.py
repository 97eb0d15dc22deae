"""The device's ground floor: page-locked and device-mapped host memory, uploads of host values
to the device (mapped reads or pinned DMA), waits on device events that do not spin a core, and
capturing a CUDA graph mid-serving.

Used by kv/, runner/, sampling/, structured/ and distributed/; imports nothing of the worker.
"""
