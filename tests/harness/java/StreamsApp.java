// A minimal Kafka Streams word count (the shape of Kafka's own WordCountDemo), exactly-once v2.
//
// Compiled and run by tests/harness/streams_app.py against the kafka-streams release of the cluster.
// Topology: lines (String values) -> split into lower-case words -> groupBy(word) (a repartition
// topic) -> count() (a RocksDB store with a changelog topic) -> toStream() -> output topic, word ->
// count (Long).  The record cache is off (statestore.cache.max.bytes=0), so every input word yields
// one output update and the committed output is fully determined by the input: for each word the
// counts 1, 2, ..., n in order, however the run is cut into transactions or restarted.
//
// Usage: StreamsApp --bootstrap H:P --application-id A --input T --output T --state-dir DIR
//                   --stop-file PATH [--record-delay-ms N] [--count-delay-ms N] [--property k=v]...
//   --stop-file: when this file appears, the app closes cleanly (committing its last transaction)
//                and exits 0.  --record-delay-ms: sleep per input line, to make a run last long
//                enough to be killed in the middle.  --count-delay-ms: sleep per output update (in the
//                count sub-topology), so output is still being written long after the first commit.
//                --property: any StreamsConfig / client setting.
// stdout, one JSON object a line: {"state": S} on every state change, {"restored": store,
// "partition": p, "records": n} when a store partition was restored from its changelog, {"closed": true} at the end,
// {"error": class, "message": m} on an uncaught exception (exit 1).

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;

public final class StreamsApp {
    public static void main(String[] argv) throws Exception {
        Map<String, String> o = new LinkedHashMap<>();
        Properties p = new Properties();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--") || i + 1 >= argv.length) usage("bad argument " + a);
            String v = argv[++i];
            if (a.equals("--property")) {
                int eq = v.indexOf('=');
                if (eq <= 0) usage("--property needs k=v, not " + v);
                p.put(v.substring(0, eq), v.substring(eq + 1));
            } else {
                o.put(a.substring(2), v);
            }
        }
        String input = need(o, "input"), output = need(o, "output");
        Path stopFile = Path.of(need(o, "stop-file"));
        long delayMs = Long.parseLong(o.getOrDefault("record-delay-ms", "0"));
        long countDelayMs = Long.parseLong(o.getOrDefault("count-delay-ms", "0"));

        p.putIfAbsent(StreamsConfig.APPLICATION_ID_CONFIG, need(o, "application-id"));
        p.putIfAbsent(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, need(o, "bootstrap"));
        p.putIfAbsent(StreamsConfig.STATE_DIR_CONFIG, need(o, "state-dir"));
        p.putIfAbsent(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.putIfAbsent(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        p.putIfAbsent(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        p.putIfAbsent(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        p.putIfAbsent(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());

        StreamsBuilder b = new StreamsBuilder();
        b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> pause(delayMs))
                .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\W+")))
                .filter((k, word) -> !word.isEmpty())
                .groupBy((k, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
                .count(Materialized.as("counts"))
                .toStream()
                .peek((k, v) -> pause(countDelayMs))
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.setStateListener((now, before) -> emit("{\"state\":\"" + now + "\"}"));
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {}

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                emit("{\"restored\":" + q(store) + ",\"partition\":" + tp.partition() + ",\"records\":" + total + "}");
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            emit("{\"error\":\"" + e.getClass().getSimpleName() + "\",\"message\":" + q(String.valueOf(e.getMessage())) + "}");
            e.printStackTrace();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        while (!Files.exists(stopFile)) {
            KafkaStreams.State s = streams.state();
            if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.NOT_RUNNING || s == KafkaStreams.State.PENDING_ERROR) {
                streams.close(Duration.ofSeconds(30));
                System.exit(1);
            }
            Thread.sleep(100);
        }
        boolean closed = streams.close(Duration.ofSeconds(60));
        emit("{\"closed\":" + closed + "}");
        System.exit(closed ? 0 : 1);
    }

    static void pause(long ms) {
        if (ms <= 0) return;
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String need(Map<String, String> o, String k) {
        String v = o.get(k);
        if (v == null) usage("--" + k + " is required");
        return v;
    }

    static void usage(String msg) {
        System.err.println("usage error: " + msg);
        System.exit(2);
    }

    static String q(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n") + "\"";
    }
}
