"""The span rules on hand-built host events (analysis/time/host_spans.py, frameworks.py): families from
the table, the innermost span with a family wins, time no span covers stays uncovered, frameworks and
micro-steps from what the trace holds."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from rank_factory import make_rank

from traceread.analysis.time import frameworks
from traceread.analysis.time import host_spans as hs


@pytest.mark.parametrize(("name", "cat", "family"), [
    ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", "data_loading"),
    ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "user_annotation", "data_loading"),
    ("[_TrainingEpochLoop].train_dataloader_next", "user_annotation", "data_loading"),
    ("Optimizer.step#AdamW.step", "user_annotation", "optimizer"),
    ("Optimizer.zero_grad#SGD.zero_grad", "user_annotation", "optimizer"),
    ("[LightningModule]Model.optimizer_step", "user_annotation", "optimizer"),
    ("aten::item", "cpu_op", "sync"), ("aten::_local_scalar_dense", "cpu_op", "sync"),
    ("cudaStreamSynchronize", "cuda_runtime", "sync"), ("cudaDeviceSynchronize", "cuda_runtime", "sync"),
    ("checkpoint.save", "user_annotation", "checkpoint"), ("torch.save", "python_function", "checkpoint"),
    ("Python GC", "python_function", "gc"), ("gc.collect", "python_function", "gc"),
    ("[Strategy]DDPStrategy.training_step", "user_annotation", "framework_step"),
    ("gloo:all_reduce", "user_annotation", "communication"), ("c10d::allreduce_", "cpu_op", "communication"),
    ("my_block", "user_annotation", "annotation"), ("dataset.py(12): __getitem__", "python_function", "python"),
    ("aten::mm", "cpu_op", "operator"), ("cudaLaunchKernel", "cuda_runtime", "operator"),
    ("cudaMemcpyAsync", "cuda_runtime", "operator"),
])
def test_family_table(name: str, cat: str, family: str) -> None:
    assert hs.family_of(name, cat) == family


def _thread(events: list[tuple[str, str, int, int]]) -> hs.ThreadEvents:
    rt = make_rank(host=[{"name": n, "cat": c, "ts": a / 1000.0, "dur": (b - a) / 1000.0, "tid": 1}
                         for n, c, a, b in events])
    return hs.thread_events(rt, 1, 0.0, 0, 10**9)


def _labels(te: hs.ThreadEvents, a: int, b: int) -> list[tuple[int, int, str | None, str | None]]:
    p0, p1, _i, span, inner = hs.label_pieces(te, np.array([a]), np.array([b]))
    return list(zip(p0.tolist(), p1.tolist(), span, inner))


def test_innermost_span_with_a_family_wins_and_uncovered_stays_uncovered() -> None:
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    te = _thread([
        ("ProfilerStep#3", "user_annotation", 0, 10_000),  # never a span
        (loader, "user_annotation", 1_000, 5_000),
        ("dataset/decode", "user_annotation", 2_000, 3_000),  # an annotation without a family inside it
        ("aten::stack", "cpu_op", 3_500, 4_000),
        ("log", "user_annotation", 6_000, 9_000),
        ("aten::item", "cpu_op", 7_000, 8_000),
        ("aten::_local_scalar_dense", "cpu_op", 7_200, 7_800),
    ])
    assert _labels(te, 0, 10_000) == [
        (0, 1_000, None, None),  # only ProfilerStep covers it: uncovered
        (1_000, 2_000, loader, None),
        (2_000, 3_000, loader, "dataset/decode"),  # the data loader's time; the annotation is the detail
        (3_000, 3_500, loader, None),
        (3_500, 4_000, loader, "aten::stack"),
        (4_000, 5_000, loader, None),
        (5_000, 6_000, None, None),
        (6_000, 7_000, "log", None),
        (7_000, 7_200, "aten::item", None),
        (7_200, 7_800, "aten::_local_scalar_dense", None),  # innermost sync
        (7_800, 8_000, "aten::item", None),
        (8_000, 9_000, "log", None),
        (9_000, 10_000, None, None),
    ]


def test_nested_annotations_and_bare_operators() -> None:
    te = _thread([("outer", "user_annotation", 0, 4_000), ("inner", "user_annotation", 1_000, 2_000),
                  ("aten::add", "cpu_op", 5_000, 6_000)])
    assert _labels(te, 0, 6_000) == [(0, 1_000, "outer", None), (1_000, 2_000, "inner", None),
                                     (2_000, 4_000, "outer", None), (4_000, 5_000, None, None),
                                     (5_000, 6_000, "aten::add", None)]  # an operator names time no span covers


def _host(names: list[tuple[str, float, float]]) -> pl.DataFrame:
    return make_rank(host=[{"name": n, "cat": "user_annotation", "ts": a, "dur": b - a} for n, a, b in names]).host


def test_frameworks_from_the_trace_and_micro_steps() -> None:
    assert frameworks.detect(_host([("[Strategy]DDPStrategy.training_step", 0, 1)]))["name"] == "PyTorch Lightning"
    assert frameworks.detect(_host([("deepspeed/runtime/engine.py(2000): step", 0, 1)]))["name"] == "DeepSpeed"
    assert frameworks.detect(_host([("transformers/trainer.py(2400): training_step", 0, 1)]))["name"] == \
        "Hugging Face Trainer"
    assert frameworks.detect(_host([("Optimizer.step#AdamW.step", 0, 1)])) is None  # plain PyTorch: nothing said
    fetch = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    host = _host([(fetch, 1, 2), (fetch, 3, 4), (fetch, 11, 12), (fetch, 13, 14), (fetch, 21, 22)])
    windows = pl.DataFrame({"step": [1, 2, 3], "start": [0.0, 10.0, 20.0], "end": [10.0, 20.0, 30.0]})
    assert frameworks.micro_steps(host, windows) == 2
    assert frameworks.micro_steps(_host([(fetch, 1, 2), (fetch, 11, 12)]), windows) is None
