{
 "rank": 0,
 "pid": 617,
 "reason": "request",
 "time_ns": 1795693790276033988,
 "step": 20,
 "stacks": "stacks/rank0.txt",
 "fr": [
  "fr/rank0.json"
 ],
 "errors": [],
 "elapsed_ms": 5.218
}