"""What NCCL itself recorded about a job: ``NCCL_DEBUG`` logs and NCCL Inspector files.

* :func:`load` — what a report reads: the logs and Inspector files under the paths, as one summary.
* :func:`parse_nccl_logs` — logs -> the report's ``nccl`` summary with diagnoses (:mod:`.logs`).
* :func:`refit` — diagnose again once the traces have named the GPUs.
* :func:`nccl_logs_under` / :func:`find_nccl_logs` — which files are NCCL logs (:mod:`.files`).
* :func:`read_inspector` / :func:`inspector_files_under` — NCCL Inspector records (:mod:`.inspector`).
"""

from traceread.analysis.comm.nccl.diagnose import SLOW_INIT_S
from traceread.analysis.comm.nccl.files import find_nccl_logs, looks_like_nccl_log, nccl_logs_under
from traceread.analysis.comm.nccl.inspector import inspector_files_under, read_inspector
from traceread.analysis.comm.nccl.lines import MAX_LINE_CHARS
from traceread.analysis.comm.nccl.logs import load, parse_nccl_logs, refit

__all__ = ["MAX_LINE_CHARS", "SLOW_INIT_S", "find_nccl_logs", "inspector_files_under", "load", "looks_like_nccl_log",
           "nccl_logs_under", "parse_nccl_logs", "read_inspector", "refit"]
