#!/usr/bin/env bash
# Installs ClickHouse 18.16 (Debian bookworm's clickhouse-server + clickhouse-client) with apt-get.
#
# Why apt into the system and not `dpkg-deb -x` into the cache: clickhouse-common links ~25 shared
# Debian libraries (poco, boost, capnp, icu, re2, rdkafka, mariadb, ...); only apt resolves them.
# Why the system service is kept from starting: tests start their own clickhouse-server on free
# loopback ports with a temporary data folder (dev/glasspipe_dev/clickhouse.py). A policy-rc.d that
# answers 101 ("forbidden") is Debian's standard way to keep a package's postinst from starting it.
source "$(dirname "$0")/../lib.sh"

want_version="18.16"

# Both packages fully installed ("install ok installed"): nothing to do, and no network needed.
is_installed() {
  local pkg
  for pkg in clickhouse-server clickhouse-client; do
    [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] || return 1
  done
}

stop_system_service() {
  # Whatever the machine's init, make sure the packaged service is not running or enabled.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl stop clickhouse-server.service >/dev/null 2>&1 || true
    systemctl disable clickhouse-server.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/clickhouse-server ]; then
    /etc/init.d/clickhouse-server stop >/dev/null 2>&1 || true
  fi
  update-rc.d clickhouse-server disable >/dev/null 2>&1 || true
}

if is_installed; then
  gp_log "clickhouse-server $(dpkg-query -W -f='${Version}' clickhouse-server) already installed"
else
  if [ "$(id -u)" -ne 0 ]; then
    gp_log "ERROR: installing clickhouse-server needs root (apt-get); run: sudo $0"
    exit 1
  fi
  created_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# temporary, from glasspipe dev/install/clickhouse.sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  gp_log "apt-get update"
  if ! apt-get update -qq; then
    gp_log "ERROR: apt-get update failed (is deb.debian.org reachable?)"
    exit 1
  fi
  gp_log "apt-get install clickhouse-server clickhouse-client (Debian bookworm: 28 packages with libraries, ~17 MB)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      clickhouse-server clickhouse-client; then
    gp_log "ERROR: apt-get install clickhouse-server failed; see the output above"
    exit 1
  fi
  if [ -n "$created_policy" ]; then
    rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
  stop_system_service
fi

server_bin="$(command -v clickhouse-server || true)"
if [ -z "$server_bin" ] && [ -x /usr/sbin/clickhouse-server ]; then server_bin=/usr/sbin/clickhouse-server; fi
if [ -z "$server_bin" ]; then
  gp_log "ERROR: clickhouse-server binary not found after install"
  exit 1
fi
version="$(dpkg-query -W -f='${Version}' clickhouse-server)"
case "$version" in
  "$want_version".*) ;;
  *) gp_log "WARNING: clickhouse-server $version installed; glasspipe's tests were written against $want_version" ;;
esac
# A port-9000 server left over from the package would not break tests (they use free ports) but wastes RAM.
if pgrep -u clickhouse -x clickhouse-server >/dev/null 2>&1; then
  gp_log "stopping the packaged clickhouse-server service (tests start their own)"
  stop_system_service
fi
echo "clickhouse ok: $server_bin $version"
