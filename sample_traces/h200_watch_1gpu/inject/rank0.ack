{
 "rank": 0,
 "pid": 503,
 "reason": "request",
 "time_ns": 1795850970682673526,
 "step": 217,
 "stacks": "stacks/rank0.txt",
 "fr": [
  "fr/rank0.json"
 ],
 "errors": [],
 "elapsed_ms": 4.45
}