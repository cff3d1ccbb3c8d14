#!/usr/bin/env bash
# Implementation of ./dev: idempotent set-up (system packages, Java, venv, Python deps, brokers), then the verb.
# Never reads stdin (CI has none); apt runs non-interactively and does not start system services.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${SPARK_MQ_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
JAVA_MIN=17
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# Spark binds its driver to the first non-loopback interface unless told otherwise; the demo, tests and
# benchmarks keep all their traffic on loopback.
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"

log() { printf '[spark-mq] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"; else return 1; fi
}

APT_UPDATED=0
apt_get() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" </dev/null
}

apt_install() {
  # apt_install PKG...: install the Debian packages that are missing, when we may (root or sudo -n).
  # Package scripts must not start system services (a system RabbitMQ/ActiveMQ would hold 5672/61613):
  # a temporary policy-rc.d forbids it; the tests run private brokers on free ports anyway.
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "${SPARK_MQ_NO_APT:-0}" = 1 ]; then
    log "missing Debian packages ${missing[*]} and SPARK_MQ_NO_APT=1: not installing"; return 1
  fi
  command -v apt-get >/dev/null 2>&1 || { log "missing ${missing[*]} and no apt-get here"; return 1; }
  log "installing Debian packages: ${missing[*]}"
  local policy=/usr/sbin/policy-rc.d own_policy=0 rc=0
  if [ ! -e "$policy" ] && as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"; then
    own_policy=1
  fi
  # Should a package script start a daemon all the same (one that ignores policy-rc.d), it is stopped
  # below: only processes that did not exist before the installation, never one the machine had.
  local pids_before; pids_before="$(mktemp)"
  python3 scripts/listeners.py pids >"$pids_before"
  if [ $APT_UPDATED = 0 ]; then apt_get update >/dev/null || rc=$?; APT_UPDATED=1; fi
  if [ $rc = 0 ]; then apt_get install --no-install-recommends "${missing[@]}" >/dev/null || rc=$?; fi
  [ $own_policy = 1 ] && as_root rm -f "$policy"
  as_root python3 scripts/listeners.py stop-new "$pids_before" >&2 || true
  rm -f "$pids_before"
  return $rc
}

# No socket outside loopback may be left by the set-up or the run: snapshot before, check after.
LISTENERS_BEFORE=""
listeners_snapshot() {
  LISTENERS_BEFORE="$(mktemp)"
  python3 scripts/listeners.py snapshot "$LISTENERS_BEFORE"
}
listeners_check() {
  # listeners_check WHAT: fail when a socket listens outside loopback that was not there at the snapshot
  python3 scripts/listeners.py check "$LISTENERS_BEFORE" "$1" || die "$1 left a port open outside loopback (above)"
}

setup_python() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtual environment $VENV"
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      apt_install python3-venv || die "python3 -m venv does not work and python3-venv cannot be installed"
      "$PY" -m venv "$VENV"
    fi
  fi
  local stamp="$VENV/.spark-mq-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing Python dependencies into $VENV (log: $VENV/pip-install.log)"
    # the build backend's warnings go to the log; on failure the log's end is shown
    if ! { "$VENV/bin/python" -m pip install -q --upgrade pip &&
           # compat mode puts the project directory on sys.path (a .pth), where pyspark's lookup of
           # pyspark_* modules (pkgutil.iter_modules) finds them: format("amqp08") resolves with no
           # register call in the dev venv too (the default editable finder hides them from it)
           "$VENV/bin/python" -m pip install -q -e ".[test]" --config-settings editable_mode=compat; } \
         </dev/null >"$VENV/pip-install.log" 2>&1; then
      tail -n 40 "$VENV/pip-install.log" >&2
      die "pip install failed (full log: $VENV/pip-install.log)"
    fi
    touch "$stamp"
  fi
}

java_major() {
  # Major version of `java` on PATH (17 for "17.0.15", 8 for "1.8.0_392"), empty when there is none.
  command -v java >/dev/null 2>&1 || return 0
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1 |
    awk '{ print ($1 == 1) ? $2 : $1 }'
}

setup_java() {
  local major; major="$(java_major)"
  if [ -z "$major" ] || [ "$major" -lt $JAVA_MIN ]; then
    log "Spark 4 and ActiveMQ need Java $JAVA_MIN+ (found: ${major:-none})"
    apt_install openjdk-17-jre-headless || die "install a Java $JAVA_MIN+ runtime (apt-get install openjdk-17-jre-headless)"
    major="$(java_major)"
    [ -n "$major" ] && [ "$major" -ge $JAVA_MIN ] || die "java on PATH is still older than $JAVA_MIN"
  fi
  log "java $major: $(command -v java)"
}

setup_brokers() {
  # The integration tests start private brokers from these packages (tests/integration/brokers.py) on free
  # loopback ports; no system service is used or needed. Missing packages are installed when we are root or
  # have sudo; otherwise the tests fail and say how to get a broker (or set SPARK_MQ_*_URL).
  local need=()
  [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq-server)
  [ -f /usr/share/activemq/bin/activemq.jar ] || need+=(activemq)
  if [ ${#need[@]} -gt 0 ]; then
    # No "service ... stop" afterwards: policy-rc.d keeps the services from starting, and RabbitMQ's
    # init script runs rabbitmqctl even to stop a server that is not running, which starts a system
    # epmd listening on every interface (issue 47). apt_install stops any daemon the installation left.
    apt_install "${need[@]}" ||
      log "could not install ${need[*]} from Debian; broker tests will fail and say how to get a broker"
  fi
  # RabbitMQ 4 (Debian 13's) in a root of its own, made once with debootstrap and cached under
  # ~/.cache/spark-mq (tests/integration/broker_rabbitmq4.py; about 45 s and 370 MB the first time)
  if [ -z "${SPARK_MQ_RABBITMQ4_AMQP_URL:-}" ]; then
    "$VENV/bin/python" tests/integration/broker_rabbitmq4.py </dev/null ||
      log "could not make the RabbitMQ 4 root; its tests will fail and say why"
  fi
}

MATRIX_PID=""
setup_matrix_start() {
  # One virtual environment per older Spark minor for the version matrix (.venv-spark-<minor>/, cached;
  # the newest is .venv itself): tests/integration/test_spark_versions.py installs the wheel into each.
  # Made in the background while the rest of the set-up runs (mostly downloads and unpacking), where
  # venvs can be made already; otherwise (no ensurepip: python3-venv missing) after setup_python.
  if "$PY" -c "import ensurepip" >/dev/null 2>&1; then
    "$PY" scripts/spark_matrix.py venvs </dev/null &
    MATRIX_PID=$!
  fi
}
setup_matrix_wait() {
  if [ -n "$MATRIX_PID" ]; then
    wait "$MATRIX_PID" || die "could not create the Spark version matrix's venvs (see .venv-spark-*/pip-install.log)"
    MATRIX_PID=""
  else
    "$PY" scripts/spark_matrix.py venvs </dev/null || die "could not create the Spark version matrix's venvs"
  fi
}

setup_jvm_archives() {
  # A class-data-sharing archive of Spark's classes per venv's pyspark (scripts/jvm_archive.py; cached in
  # ~/.cache/spark-mq/jvm-cds, about 50 s and 180 MB each the first time): the tests' Spark drivers start with
  # about a quarter less CPU. Two at a time (2 cores); a failure only makes the tests slower.
  local pythons=("$VENV/bin/python") p
  for p in .venv-spark-*/bin/python; do [ -x "$p" ] && pythons+=("$p"); done
  printf '%s\n' "${pythons[@]}" | xargs -P 2 -n 1 "$VENV/bin/python" scripts/jvm_archive.py make ||
    log "could not make every JVM class archive; the tests run without them, only slower"
}

run_pytest() {
  # Whole tests/ tree unless paths are given; extra arguments go to pytest. Exit code 5 (nothing collected)
  # is a failure too: a suite that silently lost its tests must not pass CI.
  # --quick: the unit tests and the integration tests marked `quick` (one end-to-end case per format and
  # direction), for the loop while working; ./dev test without it is the whole suite (CI, the README).
  # The tests run on SPARK_MQ_TEST_WORKERS pytest-xdist workers (default 2: the suite is bound by the 2 cores,
  # tests/DURATIONS.md); each worker starts its own brokers and SparkSession as its tests ask for them.
  # Each run writes every test's seconds to .test-durations.json (./dev durations makes tests/DURATIONS.md).
  local has_path=0 has_n=0 quick=0 a
  local args=()
  for a in "$@"; do
    case "$a" in
      --quick) quick=1; continue ;;
      -n|-n*|--numprocesses*|-pno:xdist|no:xdist) has_n=1 ;;
      -*) ;;
      *) [ -e "${a%%::*}" ] && has_path=1 ;;
    esac
    args+=("$a")
  done
  if [ $quick = 1 ]; then
    args=(-m "not integration or quick" "${args[@]}")
  fi
  [ $has_path = 1 ] || args=(tests "${args[@]}")
  local workers="${SPARK_MQ_TEST_WORKERS:-2}"
  if [ $has_n = 0 ] && [ "$workers" != 0 ]; then
    args=(-n "$workers" --dist loadgroup "${args[@]}")
  fi
  log "running: pytest ${args[*]}"
  local rc=0
  "$VENV/bin/python" -m pytest --durations=15 "${args[@]}" </dev/null || rc=$?
  if [ $rc = 5 ]; then log "pytest collected no tests: failing"; fi
  return $rc
}

verb="${1:-help}"; shift || true
case "$verb" in
  setup)
    setup_matrix_start; setup_java; setup_python; setup_brokers; setup_matrix_wait; setup_jvm_archives ;;
  test)
    listeners_snapshot
    setup_matrix_start; setup_java; setup_python; setup_brokers; setup_matrix_wait; setup_jvm_archives
    listeners_check "the set-up"
    rc=0; run_pytest "$@" || rc=$?
    listeners_check "the tests"
    exit $rc ;;
  demo)
    listeners_snapshot
    setup_java; setup_python
    listeners_check "the set-up"
    rc=0; "$VENV/bin/python" -m spark_mq.apps.demo "$@" </dev/null || rc=$?
    listeners_check "the demo"
    exit $rc ;;
  bench)
    listeners_snapshot
    setup_java; setup_python; setup_brokers
    listeners_check "the set-up"
    if ! "$VENV/bin/python" -c "import matplotlib" 2>/dev/null; then
      log "installing the bench extra (matplotlib, for the plots) into $VENV"
      "$VENV/bin/python" -m pip install -q -e ".[bench]" --config-settings editable_mode=compat </dev/null >>"$VENV/pip-install.log" 2>&1 ||
        die "pip install -e .[bench] failed (log: $VENV/pip-install.log)"
    fi
    rc=0; "$VENV/bin/python" -m bench "$@" </dev/null || rc=$?
    listeners_check "the benchmarks"
    exit $rc ;;
  soak)
    # scripts/soak.py: every format and ackMode under repeated query and broker kills (long: see
    # docs/guarantees.md, "Soak"; --messages --kills --broker-restarts --cases --seed for a short run).
    # Not part of ./dev test.
    listeners_snapshot
    setup_java; setup_python; setup_brokers
    listeners_check "the set-up"
    rc=0; "$VENV/bin/python" scripts/soak.py "$@" </dev/null || rc=$?
    listeners_check "the soak"
    exit $rc ;;
  durations)
    # tests/DURATIONS.md and tests/durations.json from the last run's .test-durations.json (a full ./dev test)
    setup_python
    exec "$VENV/bin/python" scripts/test_durations.py "$@" </dev/null ;;
  dist)
    # dist/: the wheel (pip install) and spark_mq-<version>-py-files.zip (spark-submit --py-files)
    setup_python
    exec "$VENV/bin/python" scripts/build_dist.py "$@" </dev/null ;;
  shell)
    setup_python; exec bash --rcfile <(echo "source '$VENV/bin/activate'") ;;
  *)
    sed -n '2,6p' "$ROOT/dev" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
