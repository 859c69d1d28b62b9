"""The serving runtime on a node: what is installed, how it is pinned, where it lives, how root checks it.

`installed` (`twinspark runtime facts|check`: the installed vLLM, torch, patches and whether vLLM accepts our flags),
`store` (one directory per content id, `current`/`previous`, switch, rollback, prune, the upgrade gate), `lock` (the
stock runtime's wheel lock) and `sandbox` (the transient unit root runs the check in). docs/UPGRADES.md and
docs/RUNTIME.md say how they are used.
"""
