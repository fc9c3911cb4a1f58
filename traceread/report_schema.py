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
    # extra, CPU-only ranks (no GPU in the trace): the host's split of this step (analysis.time.cpu_breakdown)
    cpu_compute_us: float
    cpu_comm_us: float
    cpu_exposed_comm_us: float
    cpu_idle_us: float
    iteration: str | None  # serving: the engine iteration's kind, prefill | decode | mixed | idle (docs/layout.md)


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
    # named host spans (data loader, optimizer step, syncs, checkpoint, GC, user annotations) inside the
    # rank's steps: [{name, family, us_per_step, count}] (analysis/time/host_spans.py)
    host_spans: list[dict[str, Any]]


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
    link: str | None  # "nvlink" | "xgmi" | "pcie" | "network" | "host" (gloo) | None (analysis.hardware.transfer_link)
    link_peak_gbps: float | None  # per-direction peak of that link; None for gloo, sockets, unknown devices
    link_name: str  # e.g. "NVLink 4 (H100/H200)", "InfiniBand NDR 400 Gb/s NIC", "gloo (host memory and loopback TCP)"
    link_source: str  # what decided the link (NCCL log, the usual NIC of the GPU, the device table)


#: What a late rank's own steps show beyond the other ranks' (window ledger; docs/ledger.md "cause").
LEDGER_CAUSES: tuple[str, ...] = ("gpu", "host", "cpu_ops")


class StragglerEntry(TypedDict, total=False):
    rank: int
    blame_us_per_step: float
    arrived_last: int
    cause: str  # "gpu" | "host" | "cpu_ops" (a CPU-only rank's own operators, window ledger) | "unknown"
    # extras
    root: bool  # False when the rank was only late because it waited on someone earlier
    evidence: str
    impact_us_per_step: float  # step time saved if it were on time: once per step, within the others' own work (window ledger)
    noise: bool  # its delay per step is within the run's own step-to-step spread: not a straggler


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
    done: list[int]  # members that completed it already (issue 37, additive): past it, never "in it"


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


class FailureRank(TypedDict, total=False):
    """One rank's end (docs/hang-and-nccl.md, "Why the job stopped")."""

    rank: int
    attempt: int  # torchrun attempt (TORCHELASTIC_RESTART_COUNT)
    family: str  # cuda_illegal_access | cuda_error | oom | nccl_error | killed | segfault | abort | fatal_signal
    # | python_error | exit_code, or an echo: peer_gone | comm_aborted | watchdog_timeout | terminated
    echo: bool  # an echo of another rank's failure (never named as the cause)
    message: str
    exception: str | None
    where: str | None  # "train.py:32 in fail": the innermost frame outside libraries
    traceback: list[str]
    host: str | None
    time_ns: int | None
    time_from: str  # which evidence gave the time (error file (ns), crash dump written, last step, ...)
    step: int | None  # optimizer steps the rank had completed when it failed
    exit_code: int | None
    signal: str | None
    sources: list[str]
    next_step: str | None


class FailureEntry(TypedDict, total=False):
    """Why the job stopped (issue 37, additive): the first failure by time, its echoes, the attempts."""

    summary: str
    lines: list[str]
    first: FailureRank | None  # None when every error is an echo (then the hang diagnosis has the cause)
    consequences: list[FailureRank]
    others: list[FailureRank]  # later failures of their own
    attempts: list[dict[str, Any]]  # attempt, folder, started_ns, last_step_ns, steps, ended_by, steps_lost, time_lost_s
    attempt: int  # the attempt the answer is about (the last one that failed)
    exit_code: int | None
    problems: list[str]


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
    failure: FailureEntry  # ``traceread hang`` only, when the job failed (issue 37): why it stopped leads


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


class WindowLedger(TypedDict, total=False):
    """Every recorded step's critical-path ledger, summed (docs/ledger.md: the window ledger)."""

    steps: int  # steps in the window (those every rank has)
    total_us: float  # sum of the steps' durations, each its longest (critical) rank's
    mean_step_us: float  # total_us / steps: the job's step figure
    median_step_us: float
    median_step: int
    spread_us: float  # 1.4826 x median absolute deviation of the step durations
    noise_us: float  # a late rank's delay per step must exceed this to be a straggler
    parts: list[LedgerPart]  # µs over the whole window, summing exactly to total_us
    by_step: list[dict[str, Any]]  # {step, step_us, critical_rank, parts}
    # late ranks: {rank, role, share_us, saving_us, delay_us, steps_late, critical_steps, straggler, cause,
    #              excess: [{category, us}], claims: [{category, role, rank, us}]}; µs over the window
    late: list[dict[str, Any]]
    # collectives with a member whose trace is missing, after every present member arrived:
    # {rank (the missing one), role, us, instances, present_spread_us, after_us, present (fewest members read)}
    blind: list[dict[str, Any]]
    # host time by the recorded span covering it: {category, role, rank, family, span, us}; a part's time
    # no span covers is the part less its spans (docs/ledger.md: which span covers host time). Also in
    # by_step[].spans; late[].spans: the late rank's host time per span above the others' median.
    spans: list[dict[str, Any]]


class Ledger(TypedDict, total=False):
    """The job's step ledger: the critical rank's median step, parts summing exactly to step_us."""

    step_us: float
    step: int
    critical_rank: int
    parts: list[LedgerPart]
    # extra: which late ranks the critical path followed, in which role, for how long
    waited_on: list[dict[str, Any]]
    window: WindowLedger  # extra: every recorded step, summed (what findings are shares of)


class RankLedger(TypedDict, total=False):
    """One rank's ledger of the job ledger's step (or its own median step when it lacks that one)."""

    step: int
    step_us: float
    parts: list[LedgerPart]


class Coverage(TypedDict, total=False):
    explained_us: float  # the findings' shares per step on average (the hang finding excluded)
    step_us: float  # the window's mean step (ledger.window.mean_step_us)
    # extras
    explained_total_us: float  # the findings' shares of the whole window
    window_us: float
    steps: int
    median_step_us: float


class Finding(TypedDict, total=False):
    id: str  # stable kind, e.g. "exposed_comm", "straggler", "pipeline_bubble"
    title: str
    impact_us_per_step: float  # its share of the window per step on average (all together never above the mean step)
    explanation: str
    category: str  # the ledger category it is a share of ("hang" for a hang)
    role: str | None  # process-group role (dp, fsdp, tp, pp, cp, ep, other) where one applies
    # extras
    impact_pct: float | None  # the share's percentage of the window
    evidence: list[str]
    suggestions: list[str]
    rank: int | None  # the rank the share belongs to, where one applies
    severity: str  # NCCL findings: the diagnosis' severity, "error" | "warning" ("info" never becomes a finding)
    memory_bytes: float | None  # memory findings (category "memory", no step time): the bytes at stake
    predicted_saving_us: float  # what-if saving per step of the suggested change, never above the impact
    impact_us_total: float  # the share of the whole window (impact_us_per_step x steps)
    steps: list[int]  # slow_steps: the steps it covers
    recovered: bool  # failure: the failed attempt was restarted and a later one ran to the end (issue 37)
    telemetry: dict[str, Any]  # straggler whose GPU was throttled: analysis.telemetry.gpu_state over the window
    xids: list[dict[str, Any]]  # hang: Xid events from the stall to its detection (compare.telemetry_join)


class LayoutGroup(TypedDict):
    """One process group and what it is for (traceread.analysis.comm.layout, docs/layout.md)."""

    pg: str  # process group name (torch's pg_name, e.g. "0" for the default group)
    desc: str | None  # pg_desc as recorded (mesh_tp, TENSOR_MODEL_PARALLEL_GROUP, undefined, ...)
    role: str  # dp | fsdp | tp | cp | pp | ep | other | unknown
    size: int
    ranks: list[int]  # global ranks of its members
    nodes: list[int]  # node ids (0.., numbered by lowest rank) its members sit on; [] when unknown
    evidence: str  # why this role, and where the nodes came from


class Layout(TypedDict):
    """The job's parallel layout: degree of each dimension (1 when absent) and every process group."""

    degrees: dict[str, int]  # {dp, fsdp, tp, pp, cp, ep}
    groups: list[LayoutGroup]  # pg "(unnamed)": collectives the trace attributes to no process group
    node_source: str | None  # where the nodes came from: run.json | NCCL log | device index | None


class _WorkloadCore(TypedDict):
    """What the job was doing (traceread.analysis.time.iterations, docs/layout.md)."""

    kind: str  # training | serving | inference | unknown
    engine: str | None  # vllm | sglang | trtllm | ... when an inference engine is seen
    evidence: str
    iterations: dict[str, int]  # serving: engine iterations used as steps, by kind (prefill, decode, mixed, idle)


class Workload(_WorkloadCore, total=False):
    """What the job was doing; extras (absent in older documents): the training framework the trace
    shows (analysis/time/frameworks.py) and what showed it; gradient accumulation: batches per step."""

    framework: str | None
    framework_evidence: str | None
    micro_steps: int | None


class NcclSummary(TypedDict, total=False):
    """``report["nccl"]``: what NCCL's own records say (traceread.analysis.comm.nccl; docs/hang-and-nccl.md).
    Documentation of the keys; the document carries it as a plain dict."""

    files: list[str]  # NCCL_DEBUG logs read
    version: str | None  # most common "NCCL version" line
    versions: dict[str, int]
    cuda_driver: int | None
    hosts: list[str]
    nodes: int | None  # the larger of distinct hosts and NCCL's own nNodes
    nranks: int | None  # largest communicator
    local_ranks: int | None  # GPUs per node (NCCL's localRanks)
    comms: list[dict[str, Any]]  # every communicator: index, comm_id, kind (init|split), parent, color, nranks, nnodes,
    #   local_ranks, ranks_seen, init_started, init_complete, hosts, init {slowest_s, slowest_rank, fastest_s,
    #   fastest_rank, median_s, ranks_timed, phases, bootstrap_least, evidence}, pending_evidence
    init_time_s: float | None  # the slowest init of any communicator on any rank
    init_timings: dict[str, float]  # global rank -> its slowest communicator init (s)
    init_phases: dict[str, dict[str, float]]  # global rank -> the phases of that slowest init
    init_total_s: dict[str, float]  # global rank -> all its communicator inits added up
    init_slowest: dict[str, Any] | None  # comm_index, comm_id, nranks, rank, comm_rank, host, total_s, phases
    env: dict[str, str]  # "<NAME> set by environment to <value>" lines (several values joined by " | ")
    network: str | None  # "Using network ..."
    net_plugin: str | None
    plugin: dict[str, Any] | None  # kind (ofi|ib|socket|external), name, version, libfabric, provider, fabric,
    #   nics, platform, protocol, gdr (what the plugin said), forced_simple, failed, external_path, gdr_off_on_capable
    ofi_provider: str | None
    nics: int | None  # NICs the network plugin uses (OFI "found N nics", IB devices, socket interfaces)
    ib_devices: list[str]
    socket_interfaces: list[str]
    bootstrap_interfaces: list[str]
    transports: dict[str, int]  # label -> channel connections (P2P/CUMEM, SHM, NET/IB, NET/Socket, ...)
    gdrdma: bool | None  # every NET connection uses GPUDirect RDMA
    hardware: dict[str, Any] | None  # gpu, source, nvlink, nvswitch, nvls_possible (True/False/None), log_hints
    rings: dict[str, list[int]]
    trees: int
    nvls: dict[str, Any]  # available, channels, comms
    channels: dict[str, int] | None
    warnings: list[dict[str, Any]]  # WARN lines: host, src (any source location), message, file, line, quote
    errors: list[dict[str, Any]]  # the WARN lines about failures
    error_codes: dict[str, int]
    timeouts: list[dict[str, Any]]  # PyTorch watchdog timeouts per rank and collective
    torch_messages: list[dict[str, Any]]
    nccl_tests_busbw_gbps: float | None
    evidence: dict[str, list[str]]  # topic -> the first lines quoted ("file:line: text"), what diagnoses cite
    diagnoses: list[dict[str, Any]]  # id, severity (error|warning|info), message, evidence, suggestion; from the
    #   failure catalogue also family, confidence, subsystem, first_line (and secondary)
    problems: list[dict[str, Any]]  # every line that says something is wrong, in order (at most 400): kind
    #   (warn|return|test|torch|timeout|libfabric), file, line, text, src, code (ncclResult_t), host, quote
    problems_total: int
    versions_by_host: dict[str, str]  # host (or file, unprefixed) -> the NCCL version it printed
    plugin_by_host: dict[str, str]  # host -> "no external plugin" | "an external plugin (libnccl-net)"
    interfaces_seen: list[str]  # NCCL <= 2.3's "NET : Using interface name:addr" lines
    unread: dict[str, Any]  # count, first: lines that name NCCL but could not be read
    inspector: dict[str, Any] | None  # NCCL Inspector files: files, records, p2p_records, bad_lines, truncated,
    #   format_versions, comms [{comm_id, comm_name, nranks, nnodes, ranks_seen, hosts, peak_gbps, peak_link,
    #   collectives [{coll, msg_bytes, count, median_transfer_us, median_busbw_gbs, best_busbw_gbs, wait_us,
    #   pct_of_peak}], late_ranks [{rank, host, pid, times_last, of, wait_caused_us, wait_share, slow}]}],
    #   slow_collectives, slow_collectives_total, p2p
    lines_parsed: int
class MemoryRank(TypedDict, total=False):
    """One rank's memory on its primary device (the accelerator with the highest peak; docs/memory.md).

    Bytes are bytes (``_bytes``); times are µs on the rank's host clock. ``peak_allocated_bytes``
    counts from the window start when ``baseline_known`` is false (2021 traces, the CPU)."""

    rank: int
    device: str  # "cuda:0", "hip:0", "cpu"
    peak_allocated_bytes: int  # largest Total Allocated in the window
    peak_reserved_bytes: int | None  # largest Total Reserved (None: not recorded, e.g. the CPU)
    headroom_bytes: int | None  # device memory - peak reserved (None: capacity or baseline unknown)
    peak_step: int | None  # ProfilerStep holding the peak
    peak_phase: str | None  # forward | backward | optimizer | other
    peak_operator: str | None  # outermost cpu_op running when the peak was reached
    fragmentation_bytes: int | None  # reserved - allocated at the peak
    growth_per_step_bytes: float | None  # allocated at the step start: (last - first) / (steps - 1)
    leak: bool  # the step-start level rose at every step boundary (>= 3 steps, > 1 MiB in all)
    # extras
    events: int
    totals_recorded: bool
    baseline_known: bool
    reserved_recorded: bool
    window_start_allocated_bytes: int | None
    peak_us: float
    peak_offset_us: float | None  # from the start of the peak's step
    peak_op_innermost: str | None
    peak_context: list[str]  # enclosing operators/annotations, outermost first
    floor_allocated_bytes: int  # lowest allocated level in the window
    reserved_at_peak_bytes: int | None
    fragmentation_pct: float | None
    capacity_bytes: int | None
    capacity_source: str | None  # "deviceProperties" | "catalogue (<part>, nominal)"
    headroom_pct: float | None
    # {step, events, start_allocated_bytes, peak_allocated_bytes, peak_offset_us, peak_reserved_bytes}
    steps: list[dict[str, Any]]
    live_at_peak: list[dict[str, Any]]  # {operator, bytes, allocations}: allocated in the window, live at the peak
    live_in_window_bytes: int
    live_before_window_bytes: int | None
    other_devices: list[dict[str, Any]]  # {device, peak_allocated_bytes}


class Memory(TypedDict, total=False):
    """Where the memory goes (``--profile-memory`` traces and memory snapshots; docs/memory.md). The
    document's ``memory`` is null when no rank recorded memory events and no snapshot was read."""

    ranks: list[MemoryRank]
    peak_rank: int | None  # highest peak allocated (lowest rank on a tie)
    peak_allocated_bytes: int | None
    median_peak_allocated_bytes: float | None
    imbalance_bytes: float | None  # highest peak - median peak
    leak_ranks: list[int]
    model: dict[str, Any] | None  # --params: the guide's training state per GPU beside the measurement
    snapshots: list[dict[str, Any]]  # {file, rank, oom, devices: [{device, peak_allocated_bytes, top_frames, ...}]}
    # extras
    min_peak_allocated_bytes: int | None
    imbalance_pct: float | None
    timeline: dict[str, Any] | None  # the peak rank's step: {rank, device, step, t_us, allocated, reserved, phases}


class Report(TypedDict, total=False):
    schema: str
    # {"paths", "world_size", "backend", "devices", ...; "missing_ranks": ranks of the job without a readable
    # trace, "missing_note": the line saying what the answer cannot see (only when ranks are missing)}
    source: dict[str, Any]
    warnings: list[str]
    ranks: list[RankEntry]
    collectives: list[CollectiveEntry]
    stragglers: list[StragglerEntry]
    pipeline: PipelineEntry | None
    slow_steps: list[SlowStepEntry]
    hang: HangEntry | None
    failure: FailureEntry  # only when the job failed (a crash, a non-zero exit); leads the findings
    findings: list[Finding]
    layout: Layout | None  # process groups' roles and the parallel degrees (None when no rank was read)
    workload: Workload | None  # training, serving or inference (None when no rank was read)
    ledger: Ledger | None  # None without GPU steps (CPU-only traces)
    coverage: Coverage | None  # how much of the ledger's step the findings explain
    # extras for charts and tables
    # top kernels: name, calls, total_us, mean_us, blocks_per_sm, occupancy_pct, wave_efficiency_pct, sm_time_lost_us
    kernels: list[dict[str, Any]]
    roofline: dict[str, Any] | None  # device, precision, peak_tflops, peak_gbps, ridge_flop_per_byte, ceiling, ops: [...]
    straggler_heatmap: dict[str, Any] | None  # {"ranks": [...], "steps": [...], "wait_us": [[...]]}
    nccl: dict[str, Any] | None  # NCCL logs + Inspector files: keys in NcclSummary
    drift: dict[str, Any]  # only with --cycle all: per-cycle numbers + growth first -> last (analysis.drift)
    step_timeline: dict[str, Any] | None  # analysis.step_timeline.job_timeline: real GPU intervals of two steps
    memory: Memory | None  # analysis.memory: peak, timeline, headroom per rank; null without memory events
    # a watched run only (compare.captures, docs/watch-report.md): the step series (downsampled), the
    # captures compared with the baseline window, and the answer (the capture with the most time lost)
    watch: dict[str, Any]
    telemetry: dict[str, Any]  # RUN/telemetry/ read (compare.telemetry_join): per rank its GPU's state
