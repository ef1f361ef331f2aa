// A transactional read-process-write loop and a verifying consumer, with Kafka's own Java clients.
//
// Compiled and run by tests/harness/txn_probe.py against the broker release's kafka-clients.
// Every line on stdout is one JSON object; diagnostics go to stderr (log4j2, WARN).
//
// Usage: TxnProbe MODE --bootstrap H:P [--property k=v]... MODE-OPTIONS
//   process  --input T --output T --group G --transactional-id ID --expect N
//            [--client-id C] [--abort-every K] [--max-poll-records R] [--transaction-timeout-ms MS]
//            [--timeout-ms MS]
//     Consumes --input (read_committed, group G, no auto commit) and, per poll, in one transaction:
//     sends each record to the SAME partition number of --output with value "rw:" + value and
//     commits the consumed offsets with sendOffsetsToTransaction(offsets, groupMetadata).  Every
//     K-th transaction is aborted instead, after which the consumer seeks back to the batch's first
//     offsets so those records are processed again in a later transaction.  Stops after N records
//     were committed.  One line per transaction: {"txn","outcome":"commit"|"abort","records","ms"};
//     then {"done":true,"committed","aborted","txns","max_txn_ms","produce_throttle_time_max",
//     "produce_throttle_time_avg"} (the last two: the producer's own metrics, i.e. the throttle
//     times the proxy told it, in ms).
//   consume  --topic T [--isolation read_committed|read_uncommitted] [--timeout-ms MS]
//     Reads every partition of T from the beginning (manual assignment) up to its end offset as
//     that isolation level sees it (the last stable offset for read_committed) and prints
//     {"p","o","k","v"} per record, then {"done":true,"count"}.
// Any exception: {"error":class,"message"} and exit 1.  Usage errors exit 2.

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class TxnProbe {
    public static void main(String[] argv) {
        if (argv.length < 1) usage("no mode given");
        String mode = argv[0];
        Map<String, String> opts = new LinkedHashMap<>();
        Properties common = new Properties();
        for (int i = 1; i < argv.length; i++) {
            String a = argv[i];
            if (!a.startsWith("--") || i + 1 >= argv.length) usage("bad argument " + a);
            String v = argv[++i];
            if (a.equals("--property")) {
                int eq = v.indexOf('=');
                if (eq <= 0) usage("--property needs k=v, not " + v);
                common.put(v.substring(0, eq), v.substring(eq + 1));
            } else {
                opts.put(a.substring(2), v);
            }
        }
        common.put("bootstrap.servers", need(opts, "bootstrap"));
        try {
            if (mode.equals("process")) process(common, opts);
            else if (mode.equals("consume")) consume(common, opts);
            else usage("unknown mode " + mode);
        } catch (Exception e) {
            e.printStackTrace();
            System.out.println("{\"error\":" + q(e.getClass().getSimpleName()) + ",\"message\":" + q(String.valueOf(e.getMessage())) + "}");
            System.out.flush();
            System.exit(1);
        }
    }

    static void process(Properties common, Map<String, String> o) {
        String input = need(o, "input"), output = need(o, "output");
        long expect = Long.parseLong(need(o, "expect"));
        int abortEvery = Integer.parseInt(o.getOrDefault("abort-every", "0"));
        long timeoutMs = Long.parseLong(o.getOrDefault("timeout-ms", "120000"));
        String clientId = o.getOrDefault("client-id", "txn-probe");

        Properties cp = new Properties();
        cp.putAll(common);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, need(o, "group"));
        cp.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId + "-consumer");
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, o.getOrDefault("max-poll-records", "100"));
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());

        Properties pp = new Properties();
        pp.putAll(common);
        pp.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, need(o, "transactional-id"));
        pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, o.getOrDefault("transaction-timeout-ms", "30000"));
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        pp.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());

        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp);
             KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            consumer.subscribe(List.of(input));
            producer.initTransactions();
            long committed = 0, aborted = 0, maxTxnMs = 0;
            int txns = 0;
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (committed < expect) {
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("only " + committed + " of " + expect + " records committed in " + timeoutMs + " ms");
                ConsumerRecords<String, String> recs = consumer.poll(Duration.ofMillis(500));
                if (recs.isEmpty()) continue;
                txns++;
                long t0 = System.nanoTime();
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                Map<TopicPartition, Long> first = new HashMap<>();
                for (ConsumerRecord<String, String> r : recs) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    producer.send(new ProducerRecord<>(output, r.partition(), r.key(), "rw:" + r.value()));
                    first.putIfAbsent(tp, r.offset());
                    next.put(tp, new OffsetAndMetadata(r.offset() + 1));
                }
                producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                boolean abort = abortEvery > 0 && txns % abortEvery == 0;
                if (abort) {
                    producer.abortTransaction();
                    first.forEach(consumer::seek);  // process them again in a later transaction
                    aborted += recs.count();
                } else {
                    producer.commitTransaction();
                    committed += recs.count();
                }
                long ms = (System.nanoTime() - t0) / 1_000_000;
                maxTxnMs = Math.max(maxTxnMs, ms);
                System.out.println("{\"txn\":" + txns + ",\"outcome\":" + q(abort ? "abort" : "commit")
                        + ",\"records\":" + recs.count() + ",\"ms\":" + ms + "}");
                System.out.flush();
            }
            System.out.println("{\"done\":true,\"committed\":" + committed + ",\"aborted\":" + aborted
                    + ",\"txns\":" + txns + ",\"max_txn_ms\":" + maxTxnMs
                    + ",\"produce_throttle_time_max\":" + metric(producer.metrics(), "produce-throttle-time-max")
                    + ",\"produce_throttle_time_avg\":" + metric(producer.metrics(), "produce-throttle-time-avg") + "}");
            System.out.flush();
        }
    }

    static void consume(Properties common, Map<String, String> o) {
        String topic = need(o, "topic");
        long timeoutMs = Long.parseLong(o.getOrDefault("timeout-ms", "60000"));
        Properties cp = new Properties();
        cp.putAll(common);
        cp.put(ConsumerConfig.CLIENT_ID_CONFIG, o.getOrDefault("client-id", "txn-verify"));
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, o.getOrDefault("isolation", "read_committed"));
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(topic, Duration.ofMillis(timeoutMs)))
                tps.add(new TopicPartition(topic, p.partition()));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofMillis(timeoutMs));
            long count = 0;
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (true) {
                boolean reached = true;
                for (TopicPartition tp : tps) reached &= consumer.position(tp) >= end.get(tp);
                if (reached) break;
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("end offsets " + end + " not reached in " + timeoutMs + " ms");
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    count++;
                    System.out.println("{\"p\":" + r.partition() + ",\"o\":" + r.offset() + ",\"k\":" + q(r.key())
                            + ",\"v\":" + q(r.value()) + "}");
                }
            }
            System.out.println("{\"done\":true,\"count\":" + count + "}");
            System.out.flush();
        }
    }

    static double metric(Map<MetricName, ? extends Metric> metrics, String name) {
        for (Map.Entry<MetricName, ? extends Metric> e : metrics.entrySet()) {
            if (e.getKey().name().equals(name) && e.getKey().group().equals("producer-metrics")) {
                Object v = e.getValue().metricValue();
                if (v instanceof Double d && !d.isNaN() && !d.isInfinite()) return d;
            }
        }
        return 0.0;
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

    /** A JSON string literal (or null). */
    static String q(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        return b.append('"').toString();
    }
}
