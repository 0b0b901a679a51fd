#!/usr/bin/env bash
# deploy/local/kafka.sh - one real Apache Kafka broker for local tests.
#
# Runs a single-node KRaft Kafka (combined broker+controller, node.id=1):
#   client listener      127.0.0.1:9092 (PLAINTEXT)
#   controller listener  127.0.0.1:9093
#   secure listener      127.0.0.1:9094 (SASL_SSL: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN, user
#                        `weir`, password `weir-secret`, created when the storage is formatted;
#                        the broker's certificate is signed by a throw-away CA this script
#                        makes once: $WEIR_SERVICES_DIR/kafka/tls/ca.pem, for 127.0.0.1 and
#                        localhost)
#   proxied listener     127.0.0.1:9095 (PLAINTEXT), advertised as 127.0.0.1:9096: nothing
#                        listens there but a TCP proxy a test starts (forwarding 9096 → 9095)
#                        to cut a client off from the broker and bring it back without
#                        stopping the shared broker; every connection of a client that
#                        bootstraps at 9096 then goes through the proxy
#   soak listener        127.0.0.1:9097 (PLAINTEXT), advertised as 127.0.0.1:9098: the same for
#                        `weir soak`'s link to the broker (cli/src/soak/), so that it never
#                        takes the tests' proxied listener
# from jars that `mvn dependency:copy-dependencies` of deploy/local/kafka/pom.xml
# pulls out of Maven Central (needs java >= 17 and mvn on PATH; nothing else).
#
# Usage:
#   deploy/local/kafka.sh start                    start (idempotent: reuses a broker that
#                                                  already answers on 127.0.0.1:9092), waits
#                                                  until it serves metadata requests
#   deploy/local/kafka.sh stop                     stop the broker started by this script
#   deploy/local/kafka.sh status                   exit 0 if a broker answers, 3 if not
#   deploy/local/kafka.sh topic NAME PARTITIONS    create a topic (RF 1; no-op if it exists)
#
# Where things live ($WEIR_SERVICES_DIR defaults to ~/.cache/weir/services):
#   $WEIR_SERVICES_DIR/kafka/libs/               broker + tools jars (kept across runs)
#   $WEIR_SERVICES_DIR/kafka/data/               KRaft metadata + topic logs (wiped on each
#                                                fresh start unless KAFKA_KEEP_DATA=1)
#   $WEIR_SERVICES_DIR/kafka/logs/server.log     broker log (stdout.log: JVM stdout/stderr)
#   $WEIR_SERVICES_DIR/kafka/server.properties   generated broker config
#   $WEIR_SERVICES_DIR/kafka/kafka.pid           pid of the broker JVM
#   $WEIR_SERVICES_DIR/kafka/tls/                the CA (ca.pem, ca.key) and the broker's key
#                                                and certificate chain (broker.pem)
#
# Environment knobs: KAFKA_HEAP_OPTS (default "-Xms256m -Xmx512m"),
#   KAFKA_START_TIMEOUT (seconds, default 90), KAFKA_KEEP_DATA=1, JAVA_HOME;
#   a second broker beside the shared one (`weir soak --own-services`): WEIR_KAFKA_PORT_BASE
#   (default 9092: the client port; the others follow it, controller +1, SASL_SSL +2, proxied
#   +3 advertised as +4, soak +5 advertised as +6) and WEIR_KAFKA_DIR (its config, data, logs
#   and pid; default $WEIR_SERVICES_DIR/kafka; the jars are always the shared ones).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM_SRC="$HERE/kafka/pom.xml"
SERVICES_DIR="${WEIR_SERVICES_DIR:-$HOME/.cache/weir/services}"
KDIR="${WEIR_KAFKA_DIR:-$SERVICES_DIR/kafka}"
LIBS="$SERVICES_DIR/kafka/libs"
DATA="$KDIR/data"
LOGS="$KDIR/logs"
PROPS="$KDIR/server.properties"
CLIENT_PROPS="$KDIR/client.properties"
PIDFILE="$KDIR/kafka.pid"
HOST=127.0.0.1
PORT="${WEIR_KAFKA_PORT_BASE:-9092}"
CONTROLLER_PORT=$((PORT + 1))
SASL_SSL_PORT=$((PORT + 2))
PROXIED_PORT=$((PORT + 3))
PROXIED_ADVERTISED_PORT=$((PORT + 4))
SOAK_PORT=$((PORT + 5))
SOAK_ADVERTISED_PORT=$((PORT + 6))
TLS="$KDIR/tls"
SASL_USER=weir
SASL_PASSWORD=weir-secret
BOOTSTRAP="$HOST:$PORT"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then JAVA="$JAVA_HOME/bin/java"; else JAVA=java; fi
# CLI tools: small heap, client JIT only, serial GC -> ~1 s JVM start.
TOOLS_JVM=(-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto
           "-Dlog4j2.configurationFile=$HERE/kafka/tools-log4j2.properties")

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
  sed -n '/^# Usage:/,/^#   deploy.*topic/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need_tools() {
  command -v "$JAVA" >/dev/null 2>&1 || die "java not found (need Java >= 17; set JAVA_HOME or put java on PATH)"
  local v
  v="$("$JAVA" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/{print $2; exit}')"
  [[ "${v%%.*}" =~ ^[0-9]+$ && "${v%%.*}" -ge 17 ]] || die "Kafka 4.x needs Java >= 17, $JAVA is '$v'"
}

# True if something accepts TCP connections on $1:$2 (cheap pre-check, not readiness).
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# Run a Kafka CLI class with the cached jars.
kafka_tool() { "$JAVA" "${TOOLS_JVM[@]}" -cp "$LIBS/*" "$@"; }

# Short client timeouts so probes against a dead/half-started broker fail fast.
write_client_props() {
  mkdir -p "$KDIR"
  cat >"$CLIENT_PROPS" <<'EOF'
request.timeout.ms=5000
default.api.timeout.ms=8000
retry.backoff.ms=200
EOF
}

# True if a Kafka broker on $BOOTSTRAP really serves a metadata request.
broker_answers() {
  port_open "$HOST" "$PORT" || return 1
  write_client_props
  kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
    --command-config "$CLIENT_PROPS" --list >/dev/null 2>&1
}

# pid from the pid file if that process is still our broker JVM.
live_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'kafka\.Kafka' || return 1
  echo "$pid"
}

have_libs() { compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null; }

# Fetch the jars once (re-fetch when the pom changes).
ensure_libs() {
  local stamp want
  want="$(sha256sum "$POM_SRC" | cut -d' ' -f1)"
  stamp="$LIBS/.pom.sha256"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && have_libs; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (needed once to fetch the Kafka jars)"
  log "fetching Kafka jars from Maven Central into $LIBS ..."
  local work="$KDIR/fetch.$$"
  rm -rf "$work" && mkdir -p "$work"
  # Run Maven on a copy of the pom so no target/ dir appears in the repo.
  cp "$POM_SRC" "$work/pom.xml"
  if ! (cd "$work" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$work/libs" >"$work/mvn.log" 2>&1); then
    tail -n 40 "$work/mvn.log" >&2 || true
    die "mvn dependency:copy-dependencies failed (full log: $work/mvn.log)"
  fi
  compgen -G "$work/libs/kafka_2.13-*.jar" >/dev/null || die "no kafka_2.13 jar after mvn (see $work/mvn.log)"
  echo "$want" >"$work/libs/.pom.sha256"
  rm -rf "$LIBS" && mv "$work/libs" "$LIBS" && rm -rf "$work"
  log "fetched $(find "$LIBS" -name '*.jar' | wc -l) jars"
}

write_server_props() {
  cat >"$PROPS" <<EOF
# Generated by deploy/local/kafka.sh - single-node KRaft broker for local tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT,SASL_SSL://$HOST:$SASL_SSL_PORT,PROXIED://$HOST:$PROXIED_PORT,SOAK://$HOST:$SOAK_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT,SASL_SSL://$HOST:$SASL_SSL_PORT,PROXIED://$HOST:$PROXIED_ADVERTISED_PORT,SOAK://$HOST:$SOAK_ADVERTISED_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,PROXIED:PLAINTEXT,SOAK:PLAINTEXT

# The secure listener: TLS with the script's CA, SASL with the SCRAM users made at format time
# (and the same user for PLAIN).
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$SASL_PASSWORD";
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS/broker.pem

log.dirs=$DATA
metadata.log.dir=$DATA

auto.create.topics.enable=true
num.partitions=4
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# A transaction open past its transaction.timeout.ms is aborted within a second (the default
# looks every 10 s): the test of a checkpoint slower than the timeout (SCENARIOS.md S19) sees
# the abort when production would, not up to 10 s later.
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000

# 2-core machines: keep thread pools small.
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
# Keep records whatever their timestamp: tests replay 2013 flights, and outputs and dead
# letters carry their input's timestamp, so retention by record time would delete closed
# segments in the middle of a test. Every fresh start wipes the data directory.
log.retention.ms=-1
EOF
}

# The throw-away CA and the broker's certificate (127.0.0.1 and localhost), made once and kept,
# so that clients can keep trusting ca.pem across restarts.
ensure_tls() {
  [[ -s "$TLS/ca.pem" && -s "$TLS/broker.pem" ]] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl not found (needed once for the SASL_SSL listener's certificates)"
  rm -rf "$TLS.tmp" && mkdir -p "$TLS.tmp"
  (
    cd "$TLS.tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=weir local test CA" \
      -keyout ca.key -out ca.pem
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout broker.key -out broker.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile broker.ext -out broker.crt
    # Kafka's PEM key store: the unencrypted PKCS#8 key, then the chain.
    cat broker.key broker.crt ca.pem >broker.pem
    rm -f broker.csr broker.ext ca.srl
  ) >"$LOGS/tls.log" 2>&1 || { cat "$LOGS/tls.log" >&2; die "making the TLS certificates failed"; }
  rm -rf "$TLS" && mv "$TLS.tmp" "$TLS"
  log "made a CA and the broker's certificate in $TLS"
}

random_cluster_id() {
  # Kafka Uuid: 16 random bytes, URL-safe base64 without padding (22 chars). Not one that
  # starts with '-': the storage tool reads it as an option and fails (1 start in 64 did).
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" == -* ]] || break
  done
  printf '%s' "$id"
}

show_log_tail() {
  local f
  for f in "$LOGS/stdout.log" "$LOGS/server.log"; do
    [[ -s "$f" ]] || continue
    echo "----- last 40 lines of $f -----" >&2
    tail -n 40 "$f" >&2
  done
}

wait_ready() {
  local pid="$1" t0=$SECONDS
  while ((SECONDS - t0 < START_TIMEOUT)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      show_log_tail
      die "broker (pid $pid) exited during startup"
    fi
    if broker_answers; then
      log "up on $BOOTSTRAP (pid $pid, ready after $((SECONDS - t0)) s)"
      return 0
    fi
    sleep 1
  done
  show_log_tail
  die "broker (pid $pid) did not answer on $BOOTSTRAP within ${START_TIMEOUT}s (still running; 'kafka.sh stop' to kill it)"
}

cmd_start() {
  need_tools
  mkdir -p "$KDIR"
  exec 9>"$KDIR/.lock"
  flock 9
  have_libs || ensure_libs
  local pid=""
  pid="$(live_pid || true)"
  if broker_answers; then
    { port_open "$HOST" "$SASL_SSL_PORT" && port_open "$HOST" "$PROXIED_PORT" && port_open "$HOST" "$SOAK_PORT"; } ||
      die "the broker on $BOOTSTRAP has no SASL_SSL listener on $HOST:$SASL_SSL_PORT or proxied ones on $HOST:$PROXIED_PORT and $HOST:$SOAK_PORT (started by an older kafka.sh?): 'kafka.sh stop' and start it again"
    log "already running on $BOOTSTRAP${pid:+ (pid $pid)} - reusing it"
    return 0
  fi
  if [[ -n "$pid" ]]; then
    log "broker pid $pid is starting - waiting for it"
    wait_ready "$pid"
    return 0
  fi
  # Nothing runs from libs/ now, so it is safe to refresh them if the pom changed.
  ensure_libs
  local p
  for p in "$PORT" "$CONTROLLER_PORT" "$SASL_SSL_PORT" "$PROXIED_PORT" "$SOAK_PORT"; do
    if port_open "$HOST" "$p"; then
      die "port $p on $HOST is taken by something that is not a working Kafka broker"
    fi
  done

  mkdir -p "$LOGS"
  ensure_tls
  write_server_props
  if [[ "${KAFKA_KEEP_DATA:-0}" == 1 && -f "$DATA/meta.properties" ]]; then
    log "keeping existing data in $DATA"
  else
    rm -rf "$DATA"
    mkdir -p "$DATA"
    local cid
    cid="$(random_cluster_id)"
    if ! kafka_tool kafka.tools.StorageTool format --cluster-id "$cid" --config "$PROPS" \
         --add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
         --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" \
         >"$LOGS/format.log" 2>&1; then
      cat "$LOGS/format.log" >&2
      die "formatting KRaft storage failed"
    fi
  fi

  # Fresh log per broker run (previous run's kept as *.prev).
  [[ -f "$LOGS/server.log" ]] && mv -f "$LOGS/server.log" "$LOGS/server.log.prev"
  : >"$LOGS/stdout.log"
  rm -f "$PIDFILE"
  local heap jvm_opts
  read -ra heap <<<"$HEAP_OPTS"
  jvm_opts=(
    "${heap[@]}"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Xshare:auto -Djava.awt.headless=true
    "-Dkafka.logs.dir=$LOGS"
    "-Dlog4j2.configurationFile=$HERE/kafka/log4j2.properties"
  )
  # setsid: own session, so the broker outlives this shell and its process group.
  # The inner bash records its own pid and then execs the JVM (same pid).
  # shellcheck disable=SC2016
  setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
    "$JAVA" "${jvm_opts[@]}" -cp "$LIBS/*" kafka.Kafka "$PROPS" \
    >>"$LOGS/stdout.log" 2>&1 </dev/null 9>&- &
  local t=0
  while [[ ! -s "$PIDFILE" ]] && ((t < 50)); do sleep 0.1; t=$((t + 1)); done
  pid="$(cat "$PIDFILE")"
  log "started broker pid $pid (log: $LOGS/server.log), waiting for it to answer ..."
  wait_ready "$pid"
}

cmd_stop() {
  mkdir -p "$KDIR"
  exec 9>"$KDIR/.lock"
  flock 9
  local pid
  if ! pid="$(live_pid)"; then
    rm -f "$PIDFILE"
    if port_open "$HOST" "$PORT"; then
      log "no broker started by this script is running (but something listens on $BOOTSTRAP - not touched)"
    else
      log "not running"
    fi
    return 0
  fi
  log "stopping broker pid $pid ..."
  kill -TERM "$pid" 2>/dev/null || true
  local t=0
  while kill -0 "$pid" 2>/dev/null && ((t < 300)); do sleep 0.1; t=$((t + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    log "broker did not stop within 30 s - killing it"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

cmd_status() {
  need_tools
  local pid=""
  pid="$(live_pid || true)"
  if have_libs && broker_answers; then
    echo "kafka: up on $BOOTSTRAP${pid:+ (pid $pid)}"
    return 0
  fi
  if [[ -n "$pid" ]]; then
    echo "kafka: pid $pid running but not answering on $BOOTSTRAP (starting, or broken: see $LOGS/server.log)"
  else
    echo "kafka: down"
  fi
  return 3
}

cmd_topic() {
  [[ $# -eq 2 ]] || usage
  local name="$1" parts="$2"
  [[ "$parts" =~ ^[1-9][0-9]*$ ]] || die "PARTITIONS must be a positive integer, got '$parts'"
  need_tools
  have_libs || ensure_libs
  port_open "$HOST" "$PORT" || die "no broker on $BOOTSTRAP (run 'kafka.sh start' first)"
  write_client_props
  local out
  if out="$(kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
        --command-config "$CLIENT_PROPS" --create --if-not-exists \
        --topic "$name" --partitions "$parts" --replication-factor 1 2>&1)"; then
    log "topic '$name' ready"
    return 0
  fi
  # --if-not-exists covers the common case; also tolerate a concurrent creator.
  if grep -qi 'already exists' <<<"$out"; then
    log "topic '$name' already exists"
    return 0
  fi
  printf '%s\n' "$out" >&2
  die "creating topic '$name' failed (is the broker up? 'kafka.sh start')"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  topic) shift; cmd_topic "$@" ;;
  *) usage ;;
esac
