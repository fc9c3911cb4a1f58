"""The map → reduce engine: per-rank work on an executor (:mod:`executors`), through data-only caches
(:mod:`caches`); Ray (:mod:`ray_executor`) only when asked for."""
