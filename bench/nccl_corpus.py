"""Precision and recall of the NCCL failure catalogue on real logs from public bug reports.

    python bench/nccl_corpus.py            # table per family, dev and holdout
    python bench/nccl_corpus.py --json     # the same as JSON
    python bench/nccl_corpus.py --batch 6  # one collection batch only (e.g. a holdout batch scored untuned)

The corpus (tests/data/nccl_corpus/corpus.json) names each log's source thread, the cause family the
thread established, and its split: ``dev`` logs were read while the signatures were written,
``holdout`` logs were collected only after the rules were frozen and never used to tune them.
A log's predicted family is the family of its first diagnosis that is not ``info``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "nccl_corpus"


def predict(log: Path) -> tuple[str | None, dict[str, Any] | None, dict[str, Any]]:
    from traceread.analysis.comm.nccl import parse_nccl_logs

    s = parse_nccl_logs([log])
    top = next((d for d in s["diagnoses"] if d["severity"] != "info"), None)
    return (top or {}).get("family"), top, s


def score(split: str | None = None, batch: int | None = None) -> dict[str, Any]:
    """Per family: tp, predicted, actual, precision, recall; and the logs read, right and wrong.

    ``split`` and ``batch`` (corpus.json's collection batch) each narrow the logs scored when given."""
    entries = json.loads((CORPUS / "corpus.json").read_text())["logs"]
    tp: Counter[str] = Counter()
    pred: Counter[str] = Counter()
    actual: Counter[str] = Counter()
    rows = []
    for e in entries:
        if split and e["split"] != split:
            continue
        if batch is not None and e.get("batch") != batch:
            continue
        fam, top, s = predict(CORPUS / f"{e['id']}.log")
        actual[e["family"]] += 1
        if fam:
            pred[fam] += 1
        if fam == e["family"]:
            tp[fam] += 1
        rows.append({"id": e["id"], "family": e["family"], "predicted": fam, "diagnosis": (top or {}).get("id"),
                     "problem_lines": s["problems_total"]})
    fams = sorted(set(actual) | set(pred))
    table = {f: {"tp": tp[f], "predicted": pred[f], "actual": actual[f],
                 "precision": tp[f] / pred[f] if pred[f] else None,
                 "recall": tp[f] / actual[f] if actual[f] else None} for f in fams}
    n = sum(actual.values())
    return {"logs": n, "correct": sum(tp.values()), "accuracy": sum(tp.values()) / n if n else None,
            "families": table, "rows": rows}


def _batch_arg(argv: list[str]) -> int | None:
    if "--batch" not in argv:
        return None
    i = argv.index("--batch")
    if i + 1 >= len(argv) or not argv[i + 1].isdigit():
        raise SystemExit("usage: nccl_corpus.py [--json] [--batch N]")
    return int(argv[i + 1])


def main() -> None:
    batch = _batch_arg(sys.argv)
    out = {split: score(split, batch) for split in ("dev", "holdout")}
    if batch is not None:
        out = {f"{split} batch {batch}": r for split, r in out.items() if r["logs"]}
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
        return
    for split, r in out.items():
        print(f"{split}: {r['correct']}/{r['logs']} logs diagnosed with the established cause family "
              f"({100 * (r['accuracy'] or 0):.0f}%)")
        print(f"  {'family':<18}{'actual':>7}{'pred':>6}{'tp':>4}{'precision':>11}{'recall':>8}")
        for f, t in r["families"].items():
            p = "-" if t["precision"] is None else f"{t['precision']:.2f}"
            rc = "-" if t["recall"] is None else f"{t['recall']:.2f}"
            print(f"  {f:<18}{t['actual']:>7}{t['predicted']:>6}{t['tp']:>4}{p:>11}{rc:>8}")
        for row in r["rows"]:
            if row["predicted"] != row["family"]:
                print(f"  miss: {row['id']}: {row['family']} -> {row['predicted']} ({row['diagnosis']})")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
