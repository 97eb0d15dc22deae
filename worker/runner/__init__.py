"""The model runner: turns a `SchedulerOutput` into device inputs (`DynamicContext`, step rows),
and runs the decoder eagerly or from CUDA graphs (decode graphs and mixed prefill+decode graphs);
`device_setup` resolves the device and dtypes it runs in.

Imports kv/, device/, models/, loading/ and sched/ (for the hand-off types only); never the engine.
"""
