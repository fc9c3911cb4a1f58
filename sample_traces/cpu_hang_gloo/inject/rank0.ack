{
 "rank": 0,
 "pid": 6530,
 "reason": "signal",
 "time_ns": 1795260893797254269,
 "step": 6,
 "stacks": "stacks/rank0.txt",
 "fr": [
  "fr/rank0.json"
 ],
 "errors": [],
 "elapsed_ms": 0.673
}