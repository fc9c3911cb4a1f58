"""The report document: what the analyses produce and every renderer (HTML, terminal, JSON) reads.

``schema: "traceread.report/1"``. The fields named in the README's JSON-schema section are stable:
they are only ever added to, never renamed or retyped within ``/1``. Fields marked *extra* feed the
HTML charts and may grow. Times are microseconds (``_us``), percentages are 0–100 (``_pct``),
bandwidths are GB/s with GB = 1e9 bytes (``_gbps``). ``None`` (JSON ``null``) means the trace cannot
support the value — never zero as a stand-in.

Lives in the core (not in ``reports/``) because the analyses build it and the renderers only read it.
"""

from __future__ import annotations

from typing import Any, TypedDict

SCHEMA_ID = "traceread.report/1"


class StepEntry(TypedDict, total=False):
    step: int
    start_us: float
    duration_us: float
    # extra: the step's own breakdown (same definitions as the rank's, on the step window)
    compute_us: float | None
    comm_us: float | None
    exposed_comm_us: float | None
    exposed_memcpy_us: float | None
    idle_us: float | None
    host_bound_us: float | None  # idle in the step because the host launched late (analysis.idle)


class IdleBreakdown(TypedDict):
    host_bound_us: float  # the launch came after the GPU went idle
    kernel_gap_us: float  # short gaps between back-to-back kernels
    other_us: float


class RankEntry(TypedDict, total=False):
    rank: int
    file: str
    device: str | None
    num_sms: int | None
    window_us: float | None
    gpu_busy_us: float | None
    compute_us: float | None
    comm_us: float | None
    exposed_comm_us: float | None
    memcpy_us: float | None
    exposed_memcpy_us: float | None
    idle_us: float | None
    comm_overlap_pct: float | None
    gpu_util_pct: float | None
    sm_efficiency_pct: float | None
    achieved_occupancy_pct: float | None
    mfu_pct: float | None
    steps: list[StepEntry]
    # extras
    host: str | None
    idle_breakdown: IdleBreakdown | None
    hfu_pct: float | None
    model_flops_per_step: float | None  # the trace-counted MFU's numerator (ranks with recorded shapes)
    # why mfu_pct is null (no recorded shapes, unknown device, no complete step), or what the trace MFU
    # leaves out (activation recompute); absent when there is nothing to say or a formula gave the MFU
    mfu_note: str
    cpu: dict[str, Any] | None  # CPU-only traces: {"compute_us", "comm_us", "idle_us", "threads": [...]}
    dropped_partial_step: int | None
    ledger: RankLedger  # this rank's step ledger (GPU ranks only)


class CollectiveEntry(TypedDict, total=False):
    pg: str
    name: str
    count: int
    bytes: int | None  # None when the trace records no message size (no comm args)
    latency_us: float
    wait_us: float
    algbw_gbps: float | None
    busbw_gbps: float | None
    # extras
    group_size: int
    link: str | None  # "nvlink" | "network" | "pcie" | None
    link_peak_gbps: float | None


class StragglerEntry(TypedDict, total=False):
    rank: int
    blame_us_per_step: float
    arrived_last: int
    cause: str  # "gpu" | "host" | "unknown"
    # extras
    root: bool  # False when the rank was only late because it waited on someone earlier
    evidence: str
    impact_us_per_step: float  # step time saved if it were on time (each delay counted once) <= blame


class PipelineEntry(TypedDict, total=False):
    stages: int
    microbatches: int
    schedule: str  # "gpipe" | "1f1b" | "interleaved" | "unknown"
    bubble_pct: float | None  # None when per-stage activity is unavailable
    theory_bubble_pct: float | None  # None when M is unknown
    # extras
    per_stage: list[dict[str, Any]]  # {"rank", "stage", "bubble_pct", "idle_us", "p2p_wait_us", "compute_us"}
    unbalanced: bool
    timeline: list[dict[str, Any]]  # {"stage", "start_us", "end_us", "kind": "fwd"|"bwd"|"p2p"|"idle"}


class SlowStepEntry(TypedDict, total=False):
    step: int
    duration_us: float
    median_us: float
    excess_us: float
    cause: str  # "compute" | "exposed_comm" | "host" | "rank:<r>" | "unknown"
    # extras
    rank: int | None
    detail: str


class HangBehind(TypedDict, total=False):
    """A member of a stuck group that has not joined its collective (docs/hang-and-nccl.md)."""

    rank: int
    why: str  # never_enqueued | not_started (its GPU never started it) | busy (in another op first) | no_dump
    enqueued: int | None  # its last enqueued collective seq in this group (None: no dump)
    completed: int | None


class HangGroup(TypedDict, total=False):
    """One stuck collective: the first one of a process group that not every member completed (or a
    later one some rank waits in)."""

    pg: str
    desc: str
    role: str  # tp | pp | ep | dp | fsdp | cp | world | other
    role_from: str  # why that role: "description '...'" or what the group ran
    op: str
    seq: int
    sizes: str  # input sizes as recorded, e.g. "[[4096, 8192]]"
    dtype: str
    members: int
    waiting: list[int]  # members in it
    behind: list[HangBehind]  # members that did not join it, and where they stopped
    culprits: list[int]  # the culprits it waits on, directly or through other groups
    enqueued_at: str | None  # "train.py:53 in train_step" (Flight Recorder frames)
    first: bool  # the group's first collective not completed by every member
    mismatch: list[str]
    note: str | None  # e.g. "every member is in it and none completes"


class HangCulprit(TypedDict, total=False):
    """A rank that stopped the job for a reason of its own (docs/hang-and-nccl.md, "Culprits")."""

    rank: int
    why: str  # gpu_stopped | host_elsewhere | no_dump | out_of_order | mismatch
    summary: str  # the one line the text and HTML print
    pg: str  # the collective it holds up (the one most ranks wait in)
    role: str
    op: str
    seq: int
    sizes: str
    dtype: str
    waiting: list[int]  # ranks in that collective
    victims: int  # ranks that wait on it, directly or through other groups
    stack: str | None  # its Python line from the stack dumps
    log: str | None  # the last log line it wrote
    positions: dict[str, list[int]]  # pg -> [last enqueued, last completed] in each of its groups
    evidence: list[str]


class HangEntry(TypedDict, total=False):
    pg: str
    seq: int | None  # None when only stacks or debug messages are available
    op: str
    missing_ranks: list[int]
    waiting_ranks: list[int]
    stacks: dict[str, str]  # rank -> "file:line in function"
    # extras
    mismatches: list[str]
    evidence: list[str]
    # added in issue 22 (additive): every culprit and every stuck group; the fields above describe
    # the top culprit's collective
    culprits: list[HangCulprit]
    groups: list[HangGroup]
    dumps: str  # "Flight Recorder: 16 dumps of 8 ranks read (pickle 8, JSON 8); no dump from rank 5"


#: Every category of the step ledger, in display order (compute first, idle last; docs/ledger.md).
#: Defined here, with the document, so that renderers know them without importing the analysis
#: (and polars): re-rendering a cached report stays fast.
LEDGER_CATEGORIES: tuple[str, ...] = (
    "compute_bound", "memory_bound", "compute_other", "comm_transfer", "comm_wait", "bubble",
    "exposed_memcpy", "host_bound", "dependency", "idle_other",
)


class LedgerPart(TypedDict):
    category: str  # one of LEDGER_CATEGORIES
    role: str | None  # process-group role for comm_wait/comm_transfer/bubble, else null
    rank: int  # whose time it is (job ledger: a late peer's rank where the critical path follows it)
    us: float


class Ledger(TypedDict, total=False):
    """The job's step ledger: the critical rank's median step, parts summing exactly to step_us."""

    step_us: float
    step: int
    critical_rank: int
    parts: list[LedgerPart]
    # extra: which late ranks the critical path followed, in which role, for how long
    waited_on: list[dict[str, Any]]


class RankLedger(TypedDict, total=False):
    """One rank's ledger of the job ledger's step (or its own median step when it lacks that one)."""

    step: int
    step_us: float
    parts: list[LedgerPart]


class Coverage(TypedDict):
    explained_us: float  # sum of the findings' impacts (shares of the step; the hang finding excluded)
    step_us: float  # the job ledger's step


class Finding(TypedDict, total=False):
    id: str  # stable kind, e.g. "exposed_comm", "straggler", "pipeline_bubble"
    title: str
    impact_us_per_step: float  # the finding's share of the job ledger's step (never more than the step in total)
    explanation: str
    category: str  # the ledger category it is a share of ("hang" for a hang)
    role: str | None  # process-group role (dp, fsdp, tp, pp, cp, ep, other) where one applies
    # extras
    impact_pct: float | None
    evidence: list[str]
    suggestions: list[str]
    rank: int | None  # the rank the share belongs to, where one applies
    predicted_saving_us: float  # what-if saving of the suggested change, never above the impact


class LayoutGroup(TypedDict):
    """One process group and what it is for (traceread.analysis.comm.layout, docs/layout.md)."""

    pg: str  # process group name (torch's pg_name, e.g. "0" for the default group)
    desc: str | None  # pg_desc as recorded (mesh_tp, TENSOR_MODEL_PARALLEL_GROUP, undefined, ...)
    role: str  # dp | fsdp | tp | cp | pp | ep | other
    size: int
    ranks: list[int]  # global ranks of its members
    nodes: list[int]  # node ids (0.., numbered by lowest rank) its members sit on; [] when unknown
    evidence: str  # why this role, and where the nodes came from


class Layout(TypedDict):
    """The job's parallel layout: degree of each dimension (1 when absent) and every process group."""

    degrees: dict[str, int]  # {dp, fsdp, tp, pp, cp, ep}
    groups: list[LayoutGroup]


class Report(TypedDict, total=False):
    schema: str
    source: dict[str, Any]  # {"paths", "world_size", "backend", "devices"}
    warnings: list[str]
    ranks: list[RankEntry]
    collectives: list[CollectiveEntry]
    stragglers: list[StragglerEntry]
    pipeline: PipelineEntry | None
    slow_steps: list[SlowStepEntry]
    hang: HangEntry | None
    findings: list[Finding]
    layout: Layout | None  # process groups' roles and the parallel degrees (None when no rank was read)
    ledger: Ledger | None  # None without GPU steps (CPU-only traces)
    coverage: Coverage | None  # how much of the ledger's step the findings explain
    # extras for charts and tables
    # top kernels: name, calls, total_us, mean_us, blocks_per_sm, occupancy_pct, wave_efficiency_pct, sm_time_lost_us
    kernels: list[dict[str, Any]]
    roofline: dict[str, Any] | None  # device, precision, peak_tflops, peak_gbps, ridge_flop_per_byte, ceiling, ops: [...]
    straggler_heatmap: dict[str, Any] | None  # {"ranks": [...], "steps": [...], "wait_us": [[...]]}
    nccl: dict[str, Any] | None  # parsed NCCL log summary + diagnoses
    drift: dict[str, Any]  # only with --cycle all: per-cycle numbers + growth first -> last (analysis.drift)
    step_timeline: dict[str, Any] | None  # analysis.step_timeline.job_timeline: real GPU intervals of two steps
