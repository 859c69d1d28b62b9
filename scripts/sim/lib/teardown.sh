# shellcheck shell=bash
# teardown [--purge]: stop and remove everything the harness made on the host, whatever state `up` left it in
# (complete, half-built, or stale from a session that was stopped). Each step tolerates "already gone".
# Kept: the base root, the caches, the wheelhouse, the tiny model (and with --purge gone: the node disks).

stop_node() {
  local n=$1 w p pids
  if w=$(launcher_pid "$n"); then
    # First SIGTERM to systemd-nspawn = orderly poweroff of the node; the launcher then exits with it.
    if p=$(nspawn_pid "$n"); then kill -TERM "$p" 2>/dev/null || true; fi
    if ! wait_until 20 eval "! kill -0 $w 2>/dev/null"; then
      log "$n: still running 20 s after poweroff, killing launcher $w"
      p=$(nspawn_pid "$n") && kill -KILL "$p" 2>/dev/null
      kill -KILL "$w" 2>/dev/null || true
    fi
    log "$n: stopped (launcher pid $w)"
  fi
  rm -f "$SIM_DIR/run/$n.pid"
  # A launcher whose PID file is gone (a state dir cleaned by hand) is still found by its own arguments.
  pids=$(pids_with_cmdline "node-launcher $n $SIM_DIR ")
  if [ -n "$pids" ]; then
    log "$n: stopping launcher(s) without a PID file: $(echo "$pids" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
  fi
  # Anything still inside the node's cgroups was started by the harness (the cgroups are ours alone).
  local root
  for root in $(node_cgroup_roots "$n"); do
    pids=$(cgroup_pids "$root")
    if [ -n "$pids" ]; then
      log "$n: killing leftover processes $(echo "$pids" | tr '\n' ' ')"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      wait_until 10 eval "[ -z \"\$(cgroup_pids $root)\" ]" || log "$n: processes in $root did not exit"
    fi
  done
}

remove_node_traces() {
  local n=$1 root mnt
  mnt=$SIM_DIR/nodes/$n/root
  if mountpoint -q "$mnt"; then umount "$mnt" 2>/dev/null || umount -l "$mnt"; fi
  for root in $(node_cgroup_roots "$n"); do
    [ -d "$root" ] && find "$root" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$root" ] && log "$n: could not remove cgroup $root"
  done
  rm -rf "/run/systemd/nspawn/propagate/$n" "/run/systemd/nspawn/unix-export/$n"
  rmdir "$SIM_DIR/run/$n.cgroupfs" 2>/dev/null || true
  # Delete veths before the namespace: netns deletion frees them asynchronously, and a rebuild right after would
  # find the old names ("File exists").
  ip link del "$(host_veth "$n")" 2>/dev/null || true
  ip link del "$(fabric_veth "$n")" 2>/dev/null || true
  if [ -e "/run/netns/$n" ]; then
    ip -n "$n" link del ic0 2>/dev/null || true
    ip netns del "$n" 2>/dev/null || true
  fi
  wait_until 5 eval "! ip link show $(host_veth "$n") >/dev/null 2>&1" || log "$n: host veth still present"
}

# stop_recorded NAME CMDLINE WHAT: stop the recorded child NAME, and any other started with our CMDLINE (its PID file
# lost): SIGTERM, SIGKILL after 10 s; then forget its PID file.
stop_recorded() {
  local p
  for p in $(recorded_pid "$1" "$2"; pids_with_cmdline "$2"); do
    kill -0 "$p" 2>/dev/null || continue
    kill -TERM "$p" 2>/dev/null || true
    wait_until 10 eval "! kill -0 $p 2>/dev/null" || kill -KILL "$p" 2>/dev/null || true
    log "$3 stopped (pid $p)"
  done
  rm -f "$SIM_DIR/run/$1.pid"
}

stop_apt_cache() {
  stop_recorded acng "$(acng_cmdline)" apt-cacher-ng
  rm -f "$SIM_DIR/run/acng.daemon.pid"
}

# The record (ALERT_LOG) stays.
stop_alert_receiver() { stop_recorded alert-receiver "$(alert_receiver_cmdline)" "alert receiver"; }

teardown() {
  local purge=${1:-} n
  # Every node either layout builds (ALL_NODES): switching between the pair and the fleet leaves nothing behind.
  for n in "${ALL_NODES[@]}"; do stop_node "$n"; done
  for n in "${ALL_NODES[@]}"; do remove_node_traces "$n"; done
  stop_apt_cache
  stop_alert_receiver
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  if ip link show "$FABRIC_BRIDGE" >/dev/null 2>&1; then ip link del "$FABRIC_BRIDGE"; fi
  # The safety net's blackhole routes stay (see safety_net in common.sh): with the bridge gone they are what keeps
  # a late packet for a simulated address on this machine.
  if [ "$purge" = --purge ]; then
    for n in "${ALL_NODES[@]}"; do rm -rf "${SIM_DIR:?}/nodes/$n"; done
    log "node disks removed"
  fi
}
