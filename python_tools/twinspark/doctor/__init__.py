"""The preflight doctor: what a node is, judged against the failures Spark pair owners hit (docs/DOCTOR.md).

`collect` reads the facts with the standard library alone, so the preflight can ship it to a fresh node before any
TwinSpark package, driver or runtime is there; `rules` judges facts (pure functions, one per finding); `command`
is `twinspark doctor`.
"""
