"""traceread: read multi-GPU PyTorch profiler traces and say where each step's time goes.

Data flows one way: collect (``traceread.collectors``) -> trace files -> read (``traceread.reader``)
-> analyse (``traceread.analysis``) -> render (``traceread.reports``). Nothing on the read/analyse
side imports torch.
"""

__version__ = "0.1.0"
