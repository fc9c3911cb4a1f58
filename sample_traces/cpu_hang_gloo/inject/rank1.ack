{
 "rank": 1,
 "pid": 6531,
 "reason": "signal",
 "time_ns": 1795260893797160930,
 "step": 6,
 "stacks": "stacks/rank1.txt",
 "fr": [
  "fr/rank1.json"
 ],
 "errors": [],
 "elapsed_ms": 0.7
}