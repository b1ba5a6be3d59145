// vehicle-stats' running aggregate in Kafka Streams, for the rebalance benchmark
// (host/benches/group.rs), which runs it beside sluice on the same broker and records:
//
//   java -cp CLASSES:LIBS/* VehicleStats BOOTSTRAP APPLICATION_ID INPUT OUTPUT STATE_DIR
//       STANDBY_REPLICAS GUARANTEE SESSION_TIMEOUT_MS MAX_POLL_INTERVAL_MS
//
// Per vehicle (the record's key) it keeps the count, mean and max speed, the last
// position and the latest `note` (the string a position may carry), in a RocksDB store
// with a changelog topic, and sends the updated summary for every record (the record
// cache is off, so none is folded into the next): the same fold vehicle-stats does but the
// distance. A position with `"work_ms":N` takes N ms to fold (a slow key, for the feedback
// loop). GUARANTEE is at_least_once or exactly_once_v2. It prints to stderr, beside Kafka
// Streams' own warnings, one JSON line per event the benchmark times, each with the wall
// clock (`at`, ms since the epoch):
//
//   {"event":"state","to":"REBALANCING","at":...}     every state change of the instance
//   {"event":"restored","partition":3,"records":N,"at":...}   a store's restore ended
//   {"event":"first","partition":3,"at":...}           the first record a task processed
//   {"event":"closed","partition":3,"at":...}          a task that processed records closed
//
// A task's first record is the one Kafka Streams hands it after it was assigned (and its
// store restored): the end of that partition's pause on this instance. Its close on the
// instance before (a revocation, a shutdown) is where that pause began.

import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

public final class VehicleStats {
    public static void main(String[] args) {
        String bootstrap = args[0], application = args[1], input = args[2], output = args[3];
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, application);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, Integer.parseInt(args[5]));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[6]);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), Integer.parseInt(args[7]));
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG), Integer.parseInt(args[8]));
        // Every update sent on, as vehicle-stats sends one summary per record.
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // The records are in the log already: read them from the start.
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // Offsets committed every second, as sluice's: the benchmark waits for them.
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .processValues(FirstRecord::new)
                .groupByKey()
                .aggregate(() -> "", VehicleStats::fold, Materialized.as("vehicle-stats"))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setStateListener((to, from) -> event("state", "\"to\":\"" + to + "\""));
        streams.setGlobalStateRestoreListener(new Restores());
        // SIGTERM closes the instance (its tasks committed, its group left), then exits 0.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(60));
            Runtime.getRuntime().halt(0);
        }));
        streams.start();
    }

    /** Folds one position (vehicle-stats' JSON) into the summary `previous` ("" at first). */
    static String fold(String key, String position, String previous) {
        if (position.contains("\"work_ms\":")) {
            try {
                Thread.sleep((long) number(position, "work_ms"));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        String note = string(position, "note");
        if (note == null && !previous.isEmpty()) {
            note = string(previous, "note");
        }
        double speed = number(position, "speed_kmh");
        long count = previous.isEmpty() ? 0 : (long) number(previous, "count");
        double mean = previous.isEmpty() ? 0 : number(previous, "mean_speed_kmh");
        double max = previous.isEmpty() ? 0 : number(previous, "max_speed_kmh");
        count += 1;
        mean += (speed - mean) / count;
        max = Math.max(max, speed);
        return "{\"vehicle_id\":\"" + key + "\",\"count\":" + count + ",\"mean_speed_kmh\":" + mean
                + ",\"max_speed_kmh\":" + max + ",\"last_ts\":" + (long) number(position, "ts")
                + ",\"lat\":" + number(position, "lat") + ",\"lon\":" + number(position, "lon")
                + (note == null ? "" : ",\"note\":\"" + note + "\"") + "}";
    }

    /** The string after `"field":"` in flat JSON `json` (one without escapes), or null. */
    static String string(String json, String field) {
        String name = "\"" + field + "\":\"";
        int start = json.indexOf(name);
        if (start < 0) {
            return null;
        }
        start += name.length();
        return json.substring(start, json.indexOf('"', start));
    }

    /** The number after `"field":` in flat JSON `json`. */
    static double number(String json, String field) {
        String name = "\"" + field + "\":";
        int start = json.indexOf(name) + name.length();
        int end = start;
        while (end < json.length() && ",}".indexOf(json.charAt(end)) < 0) {
            end++;
        }
        return Double.parseDouble(json.substring(start, end));
    }

    static void event(String name, String fields) {
        System.err.println("{\"event\":\"" + name + "\"," + fields + ",\"at\":" + System.currentTimeMillis() + "}");
    }

    /** Says when its task processes its first record; passes every record on. */
    static final class FirstRecord implements FixedKeyProcessor<String, String, String> {
        private FixedKeyProcessorContext<String, String> context;
        private boolean seen;

        @Override
        public void init(FixedKeyProcessorContext<String, String> context) {
            this.context = context;
        }

        @Override
        public void process(FixedKeyRecord<String, String> record) {
            if (!seen) {
                seen = true;
                event("first", "\"partition\":" + context.taskId().partition());
            }
            context.forward(record);
        }

        @Override
        public void close() {
            if (seen) {
                event("closed", "\"partition\":" + context.taskId().partition());
            }
        }
    }

    /** Says when each store's restore ends, and how many records it restored. */
    static final class Restores implements StateRestoreListener {
        @Override
        public void onRestoreStart(TopicPartition partition, String store, long start, long end) {}

        @Override
        public void onBatchRestored(TopicPartition partition, String store, long end, long restored) {}

        @Override
        public void onRestoreEnd(TopicPartition partition, String store, long restored) {
            event("restored", "\"partition\":" + partition.partition() + ",\"records\":" + restored);
        }
    }
}
