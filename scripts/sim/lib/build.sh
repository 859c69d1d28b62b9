# shellcheck shell=bash
# The build phases of scripts/sim/up. Each one is bounded in time and logs to $SIM_DIR/logs/.

install_host_packages() {
  local missing=0 c
  for c in mmdebstrap systemd-nspawn apt-cacher-ng ssh ssh-keygen ip ss nsenter mountpoint flock rsync; do
    command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || missing=1
  done
  if [ "$missing" = 1 ]; then
    log "installing host packages: ${HOST_PACKAGES[*]}"
    timeout 300 apt-get update -q >"$SIM_DIR/logs/host-apt-update.log" 2>&1 \
      || die "apt-get update failed; see $SIM_DIR/logs/host-apt-update.log"
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${HOST_PACKAGES[@]}" \
      >"$SIM_DIR/logs/host-apt-install.log" 2>&1 \
      || die "installing host packages failed; see $SIM_DIR/logs/host-apt-install.log"
  fi
  [ -f "$SSH_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C twinspark-sim -f "$SSH_KEY"
}

base_stamp() { cat "$SIM_DIR/rootfs/base/etc/twinspark-sim-base" 2>/dev/null; }

# The pair is running when both node launchers live and the network they hang off is complete. Then `up` only
# checks it (bounded waits) and never tears it down: other people's playbook runs may be using it.
pair_is_running() { nodes_are_running "${NODES[@]}"; }

# nodes_are_running NODE...: the harness's network is complete, each NODE's launcher lives with its management veth,
# and no node outside this layout runs (the fleet's node3..node5 when the pair is asked for: not this layout).
nodes_are_running() {
  local n
  ip route show type blackhole | grep -q "^blackhole $IC_PREFIX.0/24" || return 1
  ip route show type blackhole | grep -q "^blackhole $MGMT_PREFIX.0/24" || return 1
  ip link show "$BRIDGE" >/dev/null 2>&1 || return 1
  if switched; then ip link show "$FABRIC_BRIDGE" >/dev/null 2>&1 || return 1; fi
  # A mesh or ring has no switch, and each node its port 1 (a switch group built before has neither).
  if cabled; then
    ! ip link show "$FABRIC_BRIDGE" >/dev/null 2>&1 || return 1
    for n in "$@"; do ip -n "$n" link show ic1 >/dev/null 2>&1 || return 1; done
  fi
  for n in "$@"; do
    launcher_pid "$n" >/dev/null || return 1
    ip link show "$(host_veth "$n")" >/dev/null 2>&1 || return 1
  done
  for n in "${ALL_NODES[@]}"; do
    is_in_layout "$n" || ! launcher_pid "$n" >/dev/null || return 1
  done
}
is_in_layout() { local m; for m in "${NODES[@]}"; do [ "$m" = "$1" ] && return 0; done; return 1; }

# A fleet of one pair asked for while the simulated pair runs (node1 and node2 at the same addresses, joined by the
# same ic0): only its router node is missing (no launcher, no namespace). `up` then adds that node beside the running
# pair instead of tearing the pair down, as an operator puts a router in front of a pair that serves (CI's fleet
# smoke reuses the pair its fault step left serving: .ci/run).
pair_lacks_only_its_router() {
  [ -n "$FLEET" ] && [ "$SIM_PAIRS" = 1 ] && [ -z "$SIM_GROUP" ] || return 1
  ! launcher_pid "$ROUTER_NODE" >/dev/null && ! ip netns pids "$ROUTER_NODE" >/dev/null 2>&1 || return 1
  # shellcheck disable=SC2086  # the pair is "head worker"
  nodes_are_running ${PAIRS[0]}
}

ensure_apt_cache() {
  if acng_listening; then log "apt-cacher-ng running (pid $(acng_pid))"; return 0; fi
  stop_apt_cache
  apt_cache_up
}

check_nodes() {
  local n t
  t=$(now)
  for n in "${NODES[@]}"; do wait_node_booted "$n" "$t"; done
  for n in "${NODES[@]}"; do wait_node_ssh "$n"; done
}

network_up() {
  local n i v
  # Safety net FIRST (again; every harness command installs it): see safety_net in common.sh.
  safety_net
  for n in "${NODES[@]}"; do
    ip netns add "$n"
    ip -n "$n" link set lo up
  done
  # Rank 0 of each pair or group (a pair's first node; node1 of a group): the ports up to the API port bind only with
  # CAP_NET_BIND_SERVICE, which that node's rank alone holds (role vllm_service, issue 43 row 2). The setting belongs
  # to the network namespace, so it outlives the node's reboots, as the boot-time file does on hardware.
  [[ $SIM_API_PORT =~ ^[0-9]+$ ]] || { log "no twinspark_vllm_port in inventory/sim/group_vars/all/serving.yml"; return 1; }
  local pair heads=()
  for pair in "${PAIRS[@]}"; do heads+=("${pair%% *}"); done
  [ -z "$SIM_GROUP" ] || heads=(node1)
  for n in "${heads[@]}"; do
    ip netns exec "$n" sysctl -q -w net.ipv4.ip_unprivileged_port_start=$((SIM_API_PORT + 1))
  done
  # The interconnect, one per pair: no address and the default MTU; the spark_fabric role makes it 10.77.0.x/24 at
  # MTU 9000. A fleet's pairs each get their own veth (their own namespaces), so they never see each other's fabric.
  local pair a b
  for pair in "${PAIRS[@]}"; do
    read -r a b <<<"$pair"
    ip link add ic0 netns "$a" type veth peer name ic0 netns "$b"
    ip -n "$a" link set ic0 up
    ip -n "$b" link set ic0 up
  done
  # A group of three or more: every node's ic0 into the simulated switch, which carries jumbo frames (the role makes
  # each ic0 MTU 9000). No address here: this machine is not on the fabric.
  if switched; then
    ip link add "$FABRIC_BRIDGE" mtu 9000 type bridge
    ip link set "$FABRIC_BRIDGE" up
    for n in "${NODES[@]}"; do
      v=$(fabric_veth "$n")
      ip link add "$v" mtu 9000 type veth peer name ic0 netns "$n"
      ip link set "$v" master "$FABRIC_BRIDGE" up
      ip -n "$n" link set ic0 up
    done
  fi
  # A mesh or ring: one veth per cable, port 0 (ic0) of each node to port 1 (ic1) of the next, the last to node1. No
  # address: the role gives each cable end its own subnet from twinspark_links.
  if cabled; then
    local count=${#NODES[@]}
    for ((i = 0; i < count; i++)); do
      a=${NODES[$i]} b=${NODES[$(((i + 1) % count))]}
      ip link add ic0 netns "$a" type veth peer name ic1 netns "$b"
      ip -n "$a" link set ic0 up
      ip -n "$b" link set ic1 up
    done
  fi
  ip link add "$BRIDGE" type bridge
  ip addr add "$HOST_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in "${NODES[@]}"; do management_link "$n"; done
  log "netns: $(ip netns list | tr '\n' ' ')"
}

# A node's management interface: mgmt0 in its namespace, its veth on the bridge, its address 10.78.0.<n>.
management_link() {
  local n=$1 i v
  i=$(node_index "$n") v=$(host_veth "$n")
  ip link add "$v" type veth peer name mgmt0 netns "$n"
  ip link set "$v" master "$BRIDGE" up
  ip -n "$n" addr add "$MGMT_PREFIX.$i/24" dev mgmt0
  ip -n "$n" link set mgmt0 up
}

# The router node of a one-pair fleet beside the running pair (pair_lacks_only_its_router): its namespace and
# management link, the pair's /etc/hosts naming it too, booted and answering over SSH. The pair is not touched.
add_router_node() {
  local n=$ROUTER_NODE m t
  safety_net
  ip netns add "$n"
  ip -n "$n" link set lo up
  management_link "$n"
  for m in "${NODES[@]}"; do
    [ "$m" = "$n" ] || hosts_file "$m" >"$SIM_DIR/nodes/$m/root/etc/hosts"
  done
  t=$(now)
  start_node "$n"
  wait_node_booted "$n" "$t"
  wait_node_ssh "$n"
}

apt_cache_up() {
  local conf=$SIM_DIR/acng-conf
  mkdir -p "$conf" "$SIM_DIR/cache/acng" "$SIM_DIR/logs/acng"
  # An own config: the packaged one has no usable Debian backend on a host whose sources are deb822 files, and then
  # answers 503 after trying its built-in mirror list. Listen on the bridge address only.
  cat >"$conf/acng.conf" <<EOC
CacheDir: $SIM_DIR/cache/acng
LogDir: $SIM_DIR/logs/acng
SupportDir: /usr/lib/apt-cacher-ng
Port: $ACNG_PORT
BindAddress: $HOST_IP
ForeGround: 1
PidFile: $SIM_DIR/run/acng.daemon.pid
Remap-debrep: deb.debian.org/debian ; $MIRROR/
Remap-secdeb: deb.debian.org/debian-security security.debian.org/debian-security ; http://deb.debian.org/debian-security/
ExThreshold: 4
EOC
  # shellcheck disable=SC2016  # expanded by the inner shell
  setsid bash -c 'echo $$ >"$1/run/acng.pid"; exec apt-cacher-ng -c "$1/acng-conf"' _ "$SIM_DIR" \
    </dev/null >"$SIM_DIR/logs/acng/stdout.log" 2>&1 9>&- &
  wait_until 15 acng_listening || { cat "$SIM_DIR/logs/acng/stdout.log" >&2; die "apt-cacher-ng did not listen on $HOST_IP:$ACNG_PORT within 15 s"; }
  log "apt-cacher-ng on $HOST_IP:$ACNG_PORT, pid $(cat "$SIM_DIR/run/acng.pid")"
}

# The alert receiver on the bridge address (the nodes reach it without a default route); its log is the record.
alert_receiver_up() {
  local receiver=$SIM_SCRIPTS/../../python_tools/devtools/alert_receiver.py
  mkdir -p "$SIM_DIR/logs"
  # shellcheck disable=SC2016  # expanded by the inner shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$SIM_DIR/run/alert-receiver.pid" \
    python3 "$receiver" --listen "$HOST_IP:$ALERT_RECEIVER_PORT" --out "$ALERT_LOG" \
    </dev/null >"$SIM_DIR/logs/alert-receiver.log" 2>&1 9>&- &
  wait_until 15 alert_receiver_listening || {
    cat "$SIM_DIR/logs/alert-receiver.log" >&2
    die "the alert receiver did not listen on $HOST_IP:$ALERT_RECEIVER_PORT within 15 s"
  }
  log "alert receiver on http://$HOST_IP:$ALERT_RECEIVER_PORT/ (pid $(alert_receiver_pid)), recording to $ALERT_LOG"
}

ensure_alert_receiver() {
  if alert_receiver_listening; then log "alert receiver running (pid $(alert_receiver_pid))"; return 0; fi
  stop_alert_receiver
  alert_receiver_up
}

build_base_root() {
  local base=$SIM_DIR/rootfs/base proxy="http://$HOST_IP:$ACNG_PORT" u
  if [ "$(sed -n 1p "$base/etc/twinspark-sim-base" 2>/dev/null)" = "$BASE_PACKAGES" ]; then
    log "base root present: $base"
    return 0
  fi
  rm -rf "$base"
  mkdir -p "$SIM_DIR/rootfs"
  # Through the host's apt cache, so a rebuild on the same machine downloads nothing.
  timeout 900 mmdebstrap --variant=apt --include="$BASE_PACKAGES" \
    --aptopt="Acquire::http::Proxy \"$proxy\"" --aptopt='Acquire::http::Timeout "30"' \
    --aptopt='Acquire::Retries "3"' \
    "$SUITE" "$base" "deb $MIRROR $SUITE main" >"$SIM_DIR/logs/mmdebstrap.log" 2>&1 \
    || die "mmdebstrap failed; see $SIM_DIR/logs/mmdebstrap.log"
  rm -f "$base/etc/apt/apt.conf.d/99mmdebstrap"
  cat >"$base/etc/apt/sources.list" <<EOS
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
EOS
  # The nodes have no route off the private ranges: apt goes through the cache on the host's bridge address.
  # Every fetch bounded: a fleet converge once waited 20 minutes on an http method holding a connection the cache had
  # closed (CLOSE-WAIT). With a read timeout the method fails, and apt (and Ansible's apt module) fetch again.
  cat >"$base/etc/apt/apt.conf.d/01twinspark-sim-proxy" <<EOS
Acquire::http::Proxy "$proxy";
Acquire::http::Timeout "30";
Acquire::http::Pipeline-Depth "0";
Acquire::Retries "3";
EOS
  printf '# twinspark-sim: no DNS in the nodes; names are in /etc/hosts\noptions timeout:1 attempts:1\n' \
    >"$base/etc/resolv.conf"
  # Timers that take the dpkg lock in the middle of a playbook run, and units with no meaning in a container.
  for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
           systemd-pstore.service; do
    ln -sf /dev/null "$base/etc/systemd/system/$u"
  done
  rm -f "$base"/etc/ssh/ssh_host_*
  install -d -m 700 "$base/root/.ssh"
  install -m 600 "$SSH_KEY.pub" "$base/root/.ssh/authorized_keys"
  chroot "$base" apt-get clean
  # Ansible's apt module judges list freshness by the mtime of /var/lib/apt/lists: make the base's look stale, so
  # `update_cache: true, cache_valid_time: N` in a role really updates before installing.
  rm -f "$base/var/lib/apt/periodic/update-success-stamp"
  touch -d @0 "$base/var/lib/apt/lists"
  printf '%s\n%s\n' "$BASE_PACKAGES" "$(date -u +%FT%TZ)" >"$base/etc/twinspark-sim-base"
  log "base root built: $(du -sh "$base" | cut -f1)"
}

hosts_file() {
  local self=$1 m i
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$self"
  printf '%s\ttwinspark-sim-host\n' "$HOST_IP"
  for m in "${NODES[@]}"; do
    i=$(node_index "$m")
    printf '%s.%s\t%s\n%s.%s\t%s-ic\n' "$MGMT_PREFIX" "$i" "$m" "$IC_PREFIX" "$i" "$m"
  done
}

start_node() {
  local n=$1 dir=$SIM_DIR/nodes/$1 root=$SIM_DIR/nodes/$1/root cg
  # A node disk made over an older base root is inconsistent with the new one: start that node afresh.
  if [ -d "$dir/upper" ] && [ "$(cat "$dir/base-stamp" 2>/dev/null)" != "$(base_stamp)" ]; then
    log "$n: node disk predates the base root; starting it afresh"
    rm -rf "$dir"
  fi
  mkdir -p "$dir"/{upper,work,root}
  base_stamp >"$dir/base-stamp"
  mount -t overlay overlay -o "lowerdir=$SIM_DIR/rootfs/base,upperdir=$dir/upper,workdir=$dir/work" "$root"
  echo "$n" >"$root/etc/hostname"
  hosts_file "$n" >"$root/etc/hosts"
  [ -s "$dir/machine-id" ] || tr -d - </proc/sys/kernel/random/uuid >"$dir/machine-id"
  cp "$dir/machine-id" "$root/etc/machine-id"
  ls "$root"/etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -q -A -f "$root"
  for cg in $(node_cgroup_roots "$n"); do mkdir -p "$cg"; done
  setsid "$SIM_SCRIPTS/lib/node-launcher" "$n" "$SIM_DIR" \
    -q --boot --directory="$root" --machine="$n" --register=no --keep-unit \
    --console=passive --resolv-conf=off --link-journal=no \
    --timezone=off --capability=CAP_NET_ADMIN --bind-ro="$SIM_DIR/wheelhouse:/opt/wheelhouse" \
    </dev/null >>"$SIM_DIR/logs/$n.console.log" 2>&1 9>&- &
}

wait_node_booted() {
  local n=$1 t=$2 state="" deadline
  wait_until 10 leader_pid "$n" >/dev/null || { tail -20 "$SIM_DIR/logs/$n.console.log" >&2; die "$n: systemd-nspawn did not start"; }
  deadline=$(( $(date +%s) + 90 ))
  # Right after the fork systemd has not opened its bus yet ("offline"): ask again until it answers.
  while [ "$(date +%s)" -lt "$deadline" ]; do
    state=$(NX_TIMEOUT=30 nx "$n" systemctl is-system-running --wait 2>/dev/null) || true
    case "$state" in running|degraded|maintenance|stopping) break;; esac
    sleep 0.2
  done
  case "$state" in
    running) log "$n: booted (systemd pid $(leader_pid "$n")) after $(elapsed "$t") s";;
    degraded) log "$n: booted DEGRADED after $(elapsed "$t") s; failed units:"
              NX_TIMEOUT=10 nx "$n" systemctl --failed --no-pager --plain >&2 || true;;
    *) tail -20 "$SIM_DIR/logs/$n.console.log" >&2; die "$n: not booted within 90 s (state '$state')";;
  esac
}

wait_node_ssh() {
  local n=$1
  wait_until 30 eval "SSH_TIMEOUT=10 node_ssh $n true 2>/dev/null" \
    || die "$n: no SSH answer on $MGMT_PREFIX.$(node_index "$n") within 30 s"
  log "$n: ssh root@$MGMT_PREFIX.$(node_index "$n") answers"
}

boot_nodes() {
  local n t
  t=$(now)
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do wait_node_booted "$n" "$t"; done
  for n in "${NODES[@]}"; do wait_node_ssh "$n"; done
}

# Fresh nodes have no package lists, so the first play that installs a package ran `apt-get update` on every node at
# once. apt-cacher-ng then refreshed the same InRelease for several nodes in one second, failed to move the old copy
# aside ("File exists" in its apt-cacher.err), and the apt of one node waited on the broken answer with no end: a
# fleet converge sat 19 minutes in it (apt's own Acquire::http::Timeout did not end the wait). One node after the
# other here, bounded and retried, fills the lists and the cache before any play; the roles' apt tasks then find
# lists younger than their cache_valid_time and do not update again.
apt_lists() {  # apt_lists [NODE...]: every node of the layout when none is named
  local n try
  [ "$#" -gt 0 ] || set -- "${NODES[@]}"
  for n in "$@"; do
    for try in 1 2 3; do
      if SSH_TIMEOUT=150 node_ssh "$n" timeout 120 apt-get update -q >>"$SIM_DIR/logs/apt-lists.log" 2>&1; then
        break
      fi
      [ "$try" -lt 3 ] || die "$n: apt-get update through the apt cache failed 3 times; see $SIM_DIR/logs/apt-lists.log"
      log "$n: apt-get update failed (try $try of 3); trying again"
    done
  done
}

build_tiny_model() {
  # One folder per simulated recipe (python_tools/twinspark/recipes/tiny-*.yml): the Llama and the Qwen3.
  local venv=$SIM_DIR/tools-venv arch model
  # The tools venv installs offline from the wheelhouse, so the model is written by the same transformers
  # release that vLLM reads it with in the nodes.
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    timeout 120 python3 -m venv "$venv"
    timeout 900 "$venv/bin/pip" install -q --no-index --find-links "$SIM_DIR/wheelhouse" \
      torch==2.13.0 transformers tokenizers safetensors >"$SIM_DIR/logs/tools-venv.log" 2>&1 \
      || die "tools venv install failed; see $SIM_DIR/logs/tools-venv.log"
    touch "$venv/.complete"
  fi
  for arch in llama qwen3; do
    model=$SIM_DIR/models/tiny-$arch
    if [ -f "$model/.complete" ]; then log "tiny model present: $model"; continue; fi
    rm -rf "$model.partial"
    timeout 600 "$venv/bin/python" "$SIM_SCRIPTS/make-tiny-model.py" "$model.partial" "$arch" \
      || die "building the tiny $arch model failed"
    rm -rf "$model"
    mv "$model.partial" "$model"
    touch "$model/.complete"
  done
}
