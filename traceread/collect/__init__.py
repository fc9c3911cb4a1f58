"""traceread.collect: ``traceread collect`` — run a training job unchanged and collect its evidence.

Launcher side (no torch import): :mod:`.launcher` (process group, streaming, exit code, run.json),
:mod:`.env` (NCCL/Flight Recorder/torchelastic variables), :mod:`.watchdog` (hang detection and dump
requests), :mod:`.runinfo` (run.json merge, clock offsets), :mod:`.inject` (bootstrap location).
Rank side: ``bootstrap/sitecustomize.py`` + ``bootstrap/_traceread_rank.py`` (package data, stdlib
only until the job imports torch).
"""
