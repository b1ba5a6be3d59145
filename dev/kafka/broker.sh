#!/usr/bin/env bash
# Runs one Apache Kafka node in the foreground — KRaft, broker and controller in one
# process, on loopback — as the tests, the benchmarks and `./dev.sh kafka start` run it:
#
#   dev/kafka/broker.sh DIR NODE_ID PORT CONTROLLER_PORT CLUSTER_ID VOTERS [KEY=VALUE ...]
#
# DIR holds server.properties, log4j2.properties, the broker's log (server.log) and its
# data (data/). VOTERS is `standalone` for a cluster of this node alone (formatted with
# `StorageTool format --standalone`), or the static quorum `1@127.0.0.1:PORT,2@…` of a
# cluster whose nodes share CLUSTER_ID. The internal topics (group offsets, transaction
# state, share groups) and new topics are replicated to every node, three at most, and
# stay writable with one node down where there are three. KEY=VALUE settings are
# appended to the properties (later ones win). The data is formatted on the first start
# only, so a node stopped or killed starts again with its log. The jars come from
# $SLUICE_KAFKA_LIBS (./dev.sh set-up installs them; see dev/kafka/pom.xml).
set -euo pipefail
[ $# -ge 6 ] || {
    echo "usage: $0 DIR NODE_ID PORT CONTROLLER_PORT CLUSTER_ID VOTERS [KEY=VALUE ...]" >&2
    exit 2
}
dir=$1 node=$2 port=$3 controller=$4 cluster=$5 voters=$6
shift 6
libs=${SLUICE_KAFKA_LIBS:-${SLUICE_TOOLS:-$HOME/.cache/sluice/tools}/kafka-4.4.0/libs}
[ -e "$libs/kafka_2.13-4.4.0.jar" ] || {
    echo "$0: no Kafka broker in $libs (./dev.sh test, ./dev.sh bench or ./dev.sh kafka start installs it)" >&2
    exit 1
}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
nodes=1
[ "$voters" = standalone ] || nodes=$(tr ',' '\n' <<<"$voters" | wc -l)
replicas=$((nodes < 3 ? nodes : 3))
min_isr=$((replicas > 1 ? 2 : 1))
{
    echo "process.roles=broker,controller"
    echo "node.id=$node"
    echo "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller"
    echo "advertised.listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller"
    echo "controller.listener.names=CONTROLLER"
    echo "inter.broker.listener.name=PLAINTEXT"
    echo "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    if [ "$voters" = standalone ]; then
        echo "controller.quorum.bootstrap.servers=127.0.0.1:$controller"
    else
        echo "controller.quorum.voters=$voters"
    fi
    echo "log.dirs=$dir/data"
    for topic in offsets.topic transaction.state.log share.coordinator.state.topic; do
        echo "$topic.replication.factor=$replicas"
    done
    echo "transaction.state.log.min.isr=$min_isr"
    echo "share.coordinator.state.topic.min.isr=$min_isr"
    echo "default.replication.factor=$replicas"
    echo "min.insync.replicas=$min_isr"
    # Fewer partitions of the group offsets and transaction state than Kafka's 50: a
    # test broker creates them at its first group and transaction, in the test's time.
    echo "offsets.topic.num.partitions=8"
    echo "transaction.state.log.num.partitions=8"
    # A new group's first members are assigned at once, not 3 s later.
    echo "group.initial.rebalance.delay.ms=0"
    printf '%s\n' "$@"
} >"$dir/server.properties"
cat >"$dir/log4j2.properties" <<LOG
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $dir/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
# The controller's and the request log's chatter, as Kafka's own log4j2.yaml quiets it.
logger.controller.name = org.apache.kafka.controller
logger.controller.level = info
logger.request.name = kafka.request.logger
logger.request.level = warn
LOG
# A short-lived JVM for a test broker: one GC thread, the quick JIT only (both start
# faster on two cores than Kafka's G1 and full tiering, and serve slower). Kafka's own
# variables replace them, as its kafka-run-class.sh reads them: the benchmarks set
# Kafka's defaults there, so the broker they measure against serves at full speed.
read -ra heap_opts <<<"${KAFKA_HEAP_OPTS:--Xms128m -Xmx1g}"
read -ra jvm_opts <<<"${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true}"
java_opts=("${heap_opts[@]}" "${jvm_opts[@]}" "-Dlog4j2.configurationFile=$dir/log4j2.properties" -cp "$libs/*")
if [ ! -e "$dir/data/meta.properties" ]; then
    format=("--cluster-id=$cluster" --config "$dir/server.properties" --ignore-formatted)
    [ "$voters" != standalone ] || format+=(--standalone)
    java "${java_opts[@]}" kafka.tools.StorageTool format "${format[@]}" >"$dir/format.log" 2>&1 || {
        cat "$dir/format.log" >&2
        exit 1
    }
fi
exec java "${java_opts[@]}" kafka.Kafka "$dir/server.properties"
