"""Tools for developers and tests only: the bench scripts' rules (scripts/bench/), the router drills on loopback and
the handshaped OpenAI server they start. Not part of the `twinspark` wheel the nodes install (pyproject.toml packs
`twinspark*` only, and scripts/build-twinspark-wheel leaves this folder out of its sources)."""
