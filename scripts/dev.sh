#!/usr/bin/env bash
# Implementation of ./dev: idempotent set-up (system packages, venv, Python deps), then the verb.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SPARK_MQ_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

log() { printf '[spark-mq] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"; else return 1; fi
}

APT_UPDATED=0
apt_install() {
  # apt_install PKG...: install Debian packages that are missing, when we may.
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${SPARK_MQ_NO_APT:-0}" = 1 ]; then
    log "missing Debian packages ${missing[*]} and SPARK_MQ_NO_APT=1: not installing"; return 1
  fi
  log "installing Debian packages: ${missing[*]}"
  if [ $APT_UPDATED = 0 ]; then as_root apt-get update -qq || return 1; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtual environment $VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      apt_install python3-venv
      "$PY" -m venv "$VENV"
    fi
  fi
  local stamp="$VENV/.spark-mq-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing Python dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e ".[test]"
    touch "$stamp"
  fi
}

setup_java() {
  if ! command -v java >/dev/null 2>&1; then
    apt_install openjdk-17-jre-headless || { log "Spark needs Java 17+: install a JRE"; exit 1; }
  fi
  java -version 2>&1 | head -1 >&2
}

setup_brokers() {
  # Brokers the integration tests start privately (see tests/integration/brokers.py).
  # Missing binaries are installed from Debian when we are root (or have sudo); otherwise the
  # tests fail and say how to get a broker (or set SPARK_MQ_*_URL).
  apt_install rabbitmq-server activemq || log "could not install brokers from Debian; tests will say what is missing"
  # The Debian packages start system-wide services; the tests run their own private nodes.
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
    as_root systemctl stop rabbitmq-server || true
  fi
}

verb="${1:-help}"; shift || true
case "$verb" in
  setup)
    setup_java; setup_python; setup_brokers ;;
  test)
    setup_java; setup_python; setup_brokers
    log "running the whole test suite"
    exec "$VENV/bin/python" -m pytest tests "$@" ;;
  demo)
    setup_java; setup_python
    exec "$VENV/bin/python" -m spark_mq.demo "$@" ;;
  bench)
    setup_java; setup_python; setup_brokers
    exec "$VENV/bin/python" -m bench "$@" ;;
  shell)
    setup_python; exec bash --rcfile <(echo "source '$VENV/bin/activate'") ;;
  *)
    sed -n '2,6p' "$ROOT/dev" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
