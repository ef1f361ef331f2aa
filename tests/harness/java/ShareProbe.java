// Drives unmodified org.apache.kafka.clients.consumer.KafkaShareConsumer members (KIP-932 share groups) and
// prints one JSON line per record received, then what the group's share-partition start offsets became.
//
// Compiled by tests/harness/share_probe.py against the broker release's kafka-clients jar.
//
// Usage: ShareProbe --bootstrap H:P --topic T --group G [--members N] [--expect N] [--timeout-ms N]
//                   [--client-id ID] [--ack explicit|implicit] [--property k=v]...
//
//   Before the members start, the group's share.auto.offset.reset is set to earliest (Admin, same bootstrap),
//   so records produced before the members joined are delivered too. Each member runs in its own thread with
//   its own KafkaShareConsumer (client.id ID-<n>) and polls until the members together received --expect
//   distinct records or --timeout-ms passed. ``explicit``: every record is acknowledged ACCEPT and committed
//   with commitSync after each poll; ``implicit``: the next poll acknowledges the previous batch, and a
//   commitSync the last one before close.
//
// Output, one JSON object a line:
//   {"member":n,"partition":p,"offset":o,"delivery":d,"bytes":b,"t_ms":t}         a record (t since start)
//   {"member":n,"ack_partition":"topic-p","error":null|"ExceptionName: msg"}      explicit commit results
//   {"member":n,"metric":"name","value":v}                                        throttle metrics at the end
//   {"offsets":{"p":{"start":s,"lag":l,"end":e},...}}   share-partition start offset, unacknowledged lag, log end
//   {"done":true,"distinct":n,"elapsed_ms":t}
// Exit code 0 even when fewer records arrived (the caller checks); 2 on usage errors.

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class ShareProbe {
    static final long START = System.nanoTime();

    static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String str(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static long sinceStartMs() {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - START);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = null, topic = null, group = null, clientId = "share-probe", ack = "explicit";
        int members = 1;
        long expect = Long.MAX_VALUE, timeoutMs = 60_000;
        Properties extra = new Properties();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (i + 1 >= args.length) usage("missing value for " + a);
            String v = args[++i];
            switch (a) {
                case "--bootstrap" -> bootstrap = v;
                case "--topic" -> topic = v;
                case "--group" -> group = v;
                case "--members" -> members = Integer.parseInt(v);
                case "--expect" -> expect = Long.parseLong(v);
                case "--timeout-ms" -> timeoutMs = Long.parseLong(v);
                case "--client-id" -> clientId = v;
                case "--ack" -> ack = v;
                case "--property" -> {
                    int eq = v.indexOf('=');
                    if (eq <= 0) usage("bad --property " + v);
                    extra.setProperty(v.substring(0, eq), v.substring(eq + 1));
                }
                default -> usage("unknown argument " + a);
            }
        }
        if (bootstrap == null || topic == null || group == null) usage("--bootstrap, --topic and --group are required");
        if (!ack.equals("explicit") && !ack.equals("implicit")) usage("--ack is explicit or implicit");

        Properties adminProps = new Properties();
        adminProps.setProperty("bootstrap.servers", bootstrap);
        adminProps.setProperty("client.id", clientId + "-admin");
        try (Admin admin = Admin.create(adminProps)) {
            ConfigResource res = new ConfigResource(ConfigResource.Type.GROUP, group);
            AlterConfigOp op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                                 AlterConfigOp.OpType.SET);
            admin.incrementalAlterConfigs(Map.of(res, List.of(op))).all().get(60, TimeUnit.SECONDS);

            Set<String> seen = ConcurrentHashMap.newKeySet();
            long deadline = System.currentTimeMillis() + timeoutMs;
            final long want = expect;
            final String t = topic, g = group, cid = clientId, mode = ack, boot = bootstrap;
            List<Thread> threads = new ArrayList<>();
            List<Throwable> failures = new ArrayList<>();
            for (int m = 0; m < members; m++) {
                final int member = m;
                Thread th = new Thread(() -> {
                    try {
                        runMember(member, boot, t, g, cid, mode, extra, seen, want, deadline);
                    } catch (Throwable e) {
                        synchronized (failures) {
                            failures.add(e);
                        }
                        emit("{\"member\":" + member + ",\"failure\":" + str(e.toString()) + "}");
                    }
                }, "member-" + m);
                th.start();
                threads.add(th);
            }
            for (Thread th : threads) th.join();

            // A share partition's lag counts its records not yet acknowledged (Kafka 4.4 reports the start
            // offset as persisted, which may stay behind); the share coordinator persists acknowledgements
            // asynchronously, so wait (bounded) until every lag is zero.
            Map<TopicPartition, Long> ends = new HashMap<>();
            Collection<TopicPartition> parts = new ArrayList<>();
            admin.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS).get(topic).partitions()
                 .forEach(p -> parts.add(new TopicPartition(t, p.partition())));
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (TopicPartition tp : parts) latest.put(tp, OffsetSpec.latest());
            admin.listOffsets(latest).all().get(60, TimeUnit.SECONDS).forEach((tp, info) -> ends.put(tp, info.offset()));
            Map<TopicPartition, SharePartitionOffsetInfo> starts = Map.of();
            long offsetsDeadline = System.currentTimeMillis() + 30_000;
            while (true) {
                starts = admin.listShareGroupOffsets(Map.of(group, new ListShareGroupOffsetsSpec().topicPartitions(parts)))
                              .partitionsToOffsetInfo(group).get(60, TimeUnit.SECONDS);
                boolean caughtUp = true;
                for (TopicPartition tp : parts) {
                    SharePartitionOffsetInfo info = starts.get(tp);
                    if (info == null || info.lag().orElse(-1L) != 0L) caughtUp = false;
                }
                if (caughtUp || System.currentTimeMillis() > offsetsDeadline) break;
                Thread.sleep(500);
            }
            StringBuilder out = new StringBuilder("{\"offsets\":{");
            boolean first = true;
            for (TopicPartition tp : parts) {
                SharePartitionOffsetInfo info = starts.get(tp);
                if (!first) out.append(',');
                first = false;
                out.append('"').append(tp.partition()).append("\":{\"start\":")
                   .append(info == null ? "null" : Long.toString(info.startOffset()))
                   .append(",\"lag\":").append(info == null ? "null" : info.lag().map(String::valueOf).orElse("null"))
                   .append(",\"end\":").append(ends.get(tp)).append('}');
            }
            emit(out.append("}}").toString());
            emit("{\"done\":true,\"distinct\":" + seen.size() + ",\"elapsed_ms\":" + sinceStartMs()
                 + ",\"failures\":" + failures.size() + "}");
        }
    }

    static void runMember(int member, String bootstrap, String topic, String group, String clientId, String ack,
                          Properties extra, Set<String> seen, long expect, long deadline) {
        Properties p = new Properties();
        p.setProperty("bootstrap.servers", bootstrap);
        p.setProperty("group.id", group);
        p.setProperty("client.id", clientId + "-" + member);
        p.setProperty("share.acknowledgement.mode", ack);
        p.putAll(extra);
        try (KafkaShareConsumer<byte[], byte[]> consumer =
                 new KafkaShareConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(topic));
            while (seen.size() < expect && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    seen.add(r.partition() + ":" + r.offset());
                    int size = (r.value() == null ? 0 : r.value().length) + (r.key() == null ? 0 : r.key().length);
                    emit("{\"member\":" + member + ",\"partition\":" + r.partition() + ",\"offset\":" + r.offset()
                         + ",\"delivery\":" + r.deliveryCount().orElse((short) -1) + ",\"bytes\":" + size
                         + ",\"t_ms\":" + sinceStartMs() + "}");
                    if (ack.equals("explicit")) consumer.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                if (ack.equals("explicit") && !records.isEmpty()) commit(consumer, member);
            }
            // Implicit mode: the last poll's records are acknowledged by the next poll or a commit. Measured
            // against the cluster directly (no proxy), kafka-clients 4.4's close() left them unacknowledged
            // (lag stayed at the last batch), so commit them before closing.
            if (ack.equals("implicit")) commit(consumer, member);
            for (Map.Entry<MetricName, ? extends Metric> e : consumer.metrics().entrySet()) {
                String name = e.getKey().name();
                if (name.contains("throttle") && e.getKey().group().contains("fetch")) {
                    Object v = e.getValue().metricValue();
                    emit("{\"member\":" + member + ",\"metric\":" + str(e.getKey().group() + "/" + name)
                         + ",\"value\":" + (v instanceof Double d && !d.isNaN() && !d.isInfinite() ? d.toString() : "null") + "}");
                }
            }
        }
    }

    static void commit(KafkaShareConsumer<byte[], byte[]> consumer, int member) {
        Map<TopicIdPartition, Optional<KafkaException>> results = consumer.commitSync(Duration.ofSeconds(30));
        for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : results.entrySet()) {
            String err = e.getValue().map(x -> x.getClass().getSimpleName() + ": " + x.getMessage()).orElse(null);
            emit("{\"member\":" + member + ",\"ack_partition\":" + str(e.getKey().topicPartition().toString())
                 + ",\"error\":" + str(err) + "}");
        }
    }

    static void usage(String msg) {
        System.err.println("ShareProbe: " + msg);
        System.exit(2);
    }
}
