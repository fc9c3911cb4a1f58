"""PyTorch c10d / gloo lines in the same logs: watchdog timeouts, Flight Recorder dump signals,
monitored barriers, collective fingerprint mismatches (what ``traceread hang`` reads from logs)."""

from __future__ import annotations

import re
from typing import Any

from traceread.read.rank_prefix import pytorch_rank

_WD_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r"(?:, NumelIn=(\d+), NumelOut=(\d+))?[^)]*?Timeout\(ms\)=(\d+)\)(?: ran for (\d+) milliseconds)?"
)
_PG_RANK = re.compile(r"\[(?:PG (?:ID )?(\d+)(?: PG GUID ([^ \]]+))? )?Rank (\d+)\]")
_LAST_WORK = re.compile(r"(?i:last) enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
_AT_WORK = re.compile(r"(?:detected by watchdog at work(?: sequence id)?|Timeout at NCCL work): (\d+)")
_DUMP_FROM = re.compile(r"dump signal due to a collective timeout from\s+(this local rank|rank (\d+))")
_FR_DISABLED = re.compile(r"Stack trace of the failed collective not found")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation")
_MONITORED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\((.*?)\), but Rank (\d+) is running collective: "
    r"CollectiveFingerPrint\((.*?)\)"
)

TORCH_KEYS = re.compile(r"atchdog|Rank|Timed out|dump signal|Stack trace of the failed|monitoredBarrier")

def torch_line(raw: str, launcher_rank: int | None,
                timeouts: dict[tuple[int | None, int | None, str | None], dict[str, Any]], s: dict[str, Any]) -> None:
    """PyTorch watchdog / gloo / debug-mode lines -> ``timeouts`` and ``torch_messages``."""
    if not TORCH_KEYS.search(raw):
        return
    pr = _PG_RANK.search(raw)
    lr = pytorch_rank(raw)
    rank = int(pr.group(3)) if pr else (lr if lr is not None else launcher_rank)
    pg = pr.group(1) if pr and pr.group(1) is not None else None
    pg_guid = pr.group(2) if pr else None
    if (wd := _WD_TIMEOUT.search(raw)):
        seq = int(wd.group(1))
        t = timeouts.setdefault((rank, seq, pg), {"rank": rank, "pg": pg, "seq": seq})
        t.update({
            "op": wd.group(2),
            "numel_in": int(wd.group(3)) if wd.group(3) else None,
            "numel_out": int(wd.group(4)) if wd.group(4) else None,
            "timeout_ms": int(wd.group(5)),
            "ran_for_ms": int(wd.group(6)) if wd.group(6) else None,
        })
        return
    if (lw := _LAST_WORK.search(raw)):
        at = _AT_WORK.search(raw)
        at_seq = int(at.group(1)) if at else None
        # attach to this rank's timeout record (which was logged without a PG id)
        match = None
        for key, rec in timeouts.items():
            if at_seq is not None and key[0] == rank and rec["seq"] == at_seq:
                match = rec
        if match is None and at_seq is not None:
            match = timeouts.setdefault((rank, at_seq, pg), {"rank": rank, "pg": pg, "seq": at_seq, "op": None})
        if match is not None:
            match["last_enqueued"] = int(lw.group(1))
            match["last_completed"] = int(lw.group(2))
            if pg is not None:
                match["pg"] = pg
            if pg_guid:
                match["pg_guid"] = pg_guid
        dump = _DUMP_FROM.search(raw)
        if dump:
            s["torch_messages"].append({"rank": rank, "kind": "dump_signal",
                                        "from_rank": rank if dump.group(2) is None else int(dump.group(2)),
                                        "last_enqueued": int(lw.group(1)), "last_completed": int(lw.group(2))})
        return
    if (dump := _DUMP_FROM.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "dump_signal",
                                    "from_rank": rank if dump.group(2) is None else int(dump.group(2))})
    elif "Observed flight recorder dump signal from another rank" in raw:
        s["torch_messages"].append({"rank": rank, "kind": "dump_signal_observed"})
    elif _FR_DISABLED.search(raw):
        s["torch_messages"].append({"rank": rank, "kind": "flight_recorder_disabled"})
    elif (gt := _GLOO_TIMEOUT.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "gloo_timeout", "timeout_ms": int(gt.group(1))})
    elif (mb := _MONITORED.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "monitored_barrier",
                                    "missing_ranks": [int(x) for x in re.findall(r"\d+", mb.group(1))]})
    elif (fp := _FINGERPRINT.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "fingerprint_mismatch",
                                    "ranks": {fp.group(1): fp.group(2), fp.group(3): fp.group(4)}})
