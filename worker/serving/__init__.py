"""The replica as a process: `EngineServer` (the engine loop), its ZMQ I/O thread, and
`replica_main`, the entry of `python -m infer_cluster.worker`. The top floor of worker/.
"""
