"""traceread.collect: ``traceread collect`` — run a training job unchanged and collect its evidence.

Launcher side (no torch import): :mod:`.launcher` (process group, streaming, exit code, run.json),
:mod:`.env` (NCCL/Flight Recorder/torchelastic variables), :mod:`.watchdog` (hang detection and dump
requests), :mod:`.watch` (the slow-step watch: detection and capture requests), :mod:`.captures`
(the run folder as the channel for captures, shared with ``traceread snap``), :mod:`.live` (what
``traceread watch`` shows), :mod:`.runinfo` (run.json merge, clock offsets), :mod:`.inject` (bootstrap
location). Rank side: ``bootstrap/sitecustomize.py`` + ``bootstrap/_traceread_rank.py`` +
``bootstrap/_traceread_capture.py`` (the step series and captures) (package data, stdlib only until
the job imports torch).
"""
