"""The pair's code on the head: `io` (the worker over SSH, systemctl, the head's API), `lifecycle` (steps, lock,
pause, kick, start/stop/restart), `guard` (observe, decide, act) and `cli` (`twinspark pair ...`). The guard's rules
are pure functions in twinspark.pair.rules."""
