"""The engine of one replica: `DynamicEngine.step()` (schedule, run, sample, update), what it
reads before its runner (`model_load`), the steps in flight on the device, warm-up, stats and
the KV-reset driver.

Imports sched/, runner/, sampling/, kv/, text/ and models/; nothing below imports it.
"""
