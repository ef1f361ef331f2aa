// Drives an unmodified org.apache.kafka.clients.admin.Admin and prints one JSON line per result.
//
// Compiled by tests/harness/admin_probe.py against a kafka-clients jar together with ONE of
// compat/new/AdminCompat.java (kafka-clients >= 3.1) or compat/old/AdminCompat.java (2.6.x):
// the only API differences this program touches live there, so no reflection is needed.
// Exceptions are named only via getClass().getSimpleName(): ThrottlingQuotaExceededException
// does not exist in 2.6.
//
// Usage: AdminProbe GLOBAL... (--op NAME OPTS...)...
//   global: --bootstrap H:P  --command-config FILE  --property k=v (repeatable)
//           --retries N  --api-timeout-ms N  --retry-backoff-ms N  --request-timeout-ms N
//           --client-id ID
//   ops:    --op create --topics a,b --partitions P [--replication-factor R] [--validate-only]
//                       [--no-retry-on-quota]
//           --op create-partitions --topics a,b --total P [--validate-only] [--no-retry-on-quota]
//           --op delete --topics a,b [--no-retry-on-quota]
//           --op describe --topics a,b
//           --op alter-quotas --entity user=alice[,client-id=c] [--set k=v]... [--remove k]...
//                             [--validate-only]        (entity value "<default>" = default entity)
//           --op describe-quotas --entity user=alice[,client-id=c] [--strict]
//           --op sleep --ms N                           (pause between ops; prints nothing)
// Each op's options are its own; ops run in order, one Admin client for all of them.
//
// Output, one line per topic/entity: {"op","topic"|"entity","outcome","message","elapsed_ms",
// "done_ms", ...} where outcome is "ok" or the exception's simple class name, elapsed_ms is the
// whole admin call (issue -> every future done) and done_ms when this result's future completed
// (both from the moment the call was issued).  describe adds "partitions"; describe-quotas adds
// "quotas".  Exit code 0 even if results failed; 2 on usage errors.

import java.io.FileInputStream;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterClientQuotasOptions;
import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsOptions;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;

public final class AdminProbe {
    static final String DEFAULT = "<default>";

    /** One op: its name and its own options (multi-valued). */
    static final class Op {
        final String name;
        final Map<String, List<String>> opts = new LinkedHashMap<>();

        Op(String name) { this.name = name; }

        String get(String k, String dflt) {
            List<String> v = opts.get(k);
            return v == null || v.isEmpty() ? dflt : v.get(v.size() - 1);
        }

        String need(String k) {
            String v = get(k, null);
            if (v == null) throw new IllegalArgumentException("--op " + name + " needs --" + k);
            return v;
        }

        List<String> all(String k) { return opts.getOrDefault(k, Collections.emptyList()); }

        boolean flag(String k) { return opts.containsKey(k); }

        List<String> topics() {
            List<String> out = new ArrayList<>();
            for (String t : need("topics").split(",")) if (!t.isEmpty()) out.add(t);
            return out;
        }
    }

    static final java.util.Set<String> FLAGS = new java.util.HashSet<>(Arrays.asList(
            "validate-only", "no-retry-on-quota", "strict"));

    public static void main(String[] argv) throws Exception {
        Properties props = new Properties();
        List<Op> ops = new ArrayList<>();
        try {
            Op cur = null;
            for (int i = 0; i < argv.length; i++) {
                String a = argv[i];
                if (!a.startsWith("--")) throw new IllegalArgumentException("unexpected argument " + a);
                String k = a.substring(2);
                if (k.equals("op")) {
                    cur = new Op(value(argv, ++i, a));
                    ops.add(cur);
                } else if (cur != null) {
                    String v = FLAGS.contains(k) ? "true" : value(argv, ++i, a);
                    cur.opts.computeIfAbsent(k, x -> new ArrayList<>()).add(v);
                } else {
                    global(props, k, value(argv, ++i, a));
                }
            }
            if (!props.containsKey("bootstrap.servers")) throw new IllegalArgumentException("--bootstrap is required");
            if (ops.isEmpty()) throw new IllegalArgumentException("no --op given");
        } catch (IllegalArgumentException e) {
            System.err.println("usage error: " + e.getMessage());
            System.exit(2);
        }
        String version = clientVersion();
        try (Admin admin = Admin.create(props)) {
            for (Op op : ops) run(admin, op, version);
        }
        System.out.flush();
    }

    /** kafka-clients version, read from the jar that holds Admin (AppInfoParser moved in 4.x). */
    static String clientVersion() {
        try {
            String cls = Admin.class.getResource("Admin.class").toString();
            String url = cls.substring(0, cls.indexOf("org/apache/kafka/")) + "kafka/kafka-version.properties";
            Properties p = new Properties();
            try (InputStream in = new java.net.URL(url).openStream()) { p.load(in); }
            return p.getProperty("version", "unknown") + "/" + AdminCompat.FLAVOR;
        } catch (Exception e) {
            return "unknown/" + AdminCompat.FLAVOR;
        }
    }

    static String value(String[] argv, int i, String opt) {
        if (i >= argv.length) throw new IllegalArgumentException(opt + " needs a value");
        return argv[i];
    }

    static void global(Properties props, String k, String v) throws Exception {
        switch (k) {
            case "bootstrap": props.put("bootstrap.servers", v); break;
            case "retries": props.put("retries", v); break;
            case "api-timeout-ms": props.put("default.api.timeout.ms", v); break;
            case "retry-backoff-ms": props.put("retry.backoff.ms", v); break;
            case "request-timeout-ms": props.put("request.timeout.ms", v); break;
            case "client-id": props.put("client.id", v); break;
            case "command-config":
                try (InputStream in = new FileInputStream(v)) { props.load(in); }
                break;
            case "property": {
                int eq = v.indexOf('=');
                if (eq <= 0) throw new IllegalArgumentException("--property wants k=v, got " + v);
                props.put(v.substring(0, eq), v.substring(eq + 1));
                break;
            }
            default: throw new IllegalArgumentException("unknown option --" + k);
        }
    }

    // ------------------------------------------------------------------ ops

    static void run(Admin admin, Op op, String version) throws Exception {
        switch (op.name) {
            case "create": create(admin, op, version); break;
            case "create-partitions": createPartitions(admin, op, version); break;
            case "delete": delete(admin, op, version); break;
            case "describe": describe(admin, op, version); break;
            case "alter-quotas": alterQuotas(admin, op, version); break;
            case "describe-quotas": describeQuotas(admin, op, version); break;
            case "sleep": Thread.sleep(Long.parseLong(op.need("ms"))); break;
            default:
                System.err.println("usage error: unknown op " + op.name);
                System.exit(2);
        }
    }

    static void create(Admin admin, Op op, String version) throws Exception {
        int partitions = Integer.parseInt(op.need("partitions"));
        String rf = op.get("replication-factor", null);
        Optional<Short> replication = rf == null ? Optional.empty() : Optional.of(Short.parseShort(rf));
        List<NewTopic> topics = new ArrayList<>();
        for (String t : op.topics()) topics.add(new NewTopic(t, Optional.of(partitions), replication));
        CreateTopicsOptions o = new CreateTopicsOptions().validateOnly(op.flag("validate-only"));
        if (op.flag("no-retry-on-quota")) AdminCompat.noRetryOnQuota(o);
        long t0 = System.nanoTime();
        Map<String, ? extends KafkaFuture<?>> futures = admin.createTopics(topics, o).values();
        report(op, "topic", t0, futures, version, null);
    }

    static void createPartitions(Admin admin, Op op, String version) throws Exception {
        int total = Integer.parseInt(op.need("total"));
        Map<String, NewPartitions> req = new LinkedHashMap<>();
        for (String t : op.topics()) req.put(t, NewPartitions.increaseTo(total));
        CreatePartitionsOptions o = new CreatePartitionsOptions().validateOnly(op.flag("validate-only"));
        if (op.flag("no-retry-on-quota")) AdminCompat.noRetryOnQuota(o);
        long t0 = System.nanoTime();
        report(op, "topic", t0, admin.createPartitions(req, o).values(), version, null);
    }

    static void delete(Admin admin, Op op, String version) throws Exception {
        DeleteTopicsOptions o = new DeleteTopicsOptions();
        if (op.flag("no-retry-on-quota")) AdminCompat.noRetryOnQuota(o);
        long t0 = System.nanoTime();
        report(op, "topic", t0, AdminCompat.byName(admin.deleteTopics(op.topics(), o)), version, null);
    }

    static void describe(Admin admin, Op op, String version) throws Exception {
        long t0 = System.nanoTime();
        Map<String, KafkaFuture<TopicDescription>> futures = AdminCompat.byName(admin.describeTopics(op.topics()));
        report(op, "topic", t0, futures, version, v -> "\"partitions\":" + ((TopicDescription) v).partitions().size());
    }

    static void alterQuotas(Admin admin, Op op, String version) throws Exception {
        ClientQuotaEntity entity = new ClientQuotaEntity(entityMap(op.need("entity")));
        List<ClientQuotaAlteration.Op> changes = new ArrayList<>();
        for (String kv : op.all("set")) {
            int eq = kv.indexOf('=');
            if (eq <= 0) throw new IllegalArgumentException("--set wants k=v, got " + kv);
            changes.add(new ClientQuotaAlteration.Op(kv.substring(0, eq), Double.parseDouble(kv.substring(eq + 1))));
        }
        for (String k : op.all("remove")) changes.add(new ClientQuotaAlteration.Op(k, null));
        AlterClientQuotasOptions o = new AlterClientQuotasOptions().validateOnly(op.flag("validate-only"));
        long t0 = System.nanoTime();
        Map<ClientQuotaEntity, KafkaFuture<Void>> byEntity =
                admin.alterClientQuotas(Collections.singletonList(new ClientQuotaAlteration(entity, changes)), o).values();
        Map<String, KafkaFuture<Void>> futures = new LinkedHashMap<>();
        for (Map.Entry<ClientQuotaEntity, KafkaFuture<Void>> e : byEntity.entrySet())
            futures.put(entityString(e.getKey().entries()), e.getValue());
        report(op, "entity", t0, futures, version, null);
    }

    static void describeQuotas(Admin admin, Op op, String version) throws Exception {
        String spec = op.need("entity");
        List<ClientQuotaFilterComponent> comps = new ArrayList<>();
        for (Map.Entry<String, String> e : entityMap(spec).entrySet())
            comps.add(e.getValue() == null ? ClientQuotaFilterComponent.ofDefaultEntity(e.getKey())
                                           : ClientQuotaFilterComponent.ofEntity(e.getKey(), e.getValue()));
        ClientQuotaFilter filter = op.flag("strict") ? ClientQuotaFilter.containsOnly(comps) : ClientQuotaFilter.contains(comps);
        long t0 = System.nanoTime();
        KafkaFuture<Map<ClientQuotaEntity, Map<String, Double>>> f = admin.describeClientQuotas(filter).entities();
        Map<String, Long> done = new ConcurrentHashMap<>();
        f.whenComplete((v, err) -> done.put(spec, System.nanoTime()));
        Map<ClientQuotaEntity, Map<String, Double>> result = null;
        Throwable error = null;
        try {
            result = f.get();
        } catch (ExecutionException e) {
            error = e.getCause() == null ? e : e.getCause();
        }
        long elapsed = ms(System.nanoTime() - t0);
        long doneMs = ms(done.getOrDefault(spec, System.nanoTime()) - t0);
        if (error != null || result.isEmpty()) {
            println(line(op, "entity", spec, error, elapsed, doneMs, version, error == null ? "\"quotas\":{}" : null));
            return;
        }
        for (Map.Entry<ClientQuotaEntity, Map<String, Double>> e : result.entrySet()) {
            StringBuilder q = new StringBuilder("\"quotas\":{");
            boolean first = true;
            for (Map.Entry<String, Double> kv : new TreeMap<>(e.getValue()).entrySet()) {
                if (!first) q.append(',');
                first = false;
                q.append(str(kv.getKey())).append(':').append(num(kv.getValue()));
            }
            q.append('}');
            println(line(op, "entity", entityString(e.getKey().entries()), null, elapsed, doneMs, version, q.toString()));
        }
    }

    // ------------------------------------------------------------- results

    interface Extra { String json(Object value); }

    /** Wait for every future, then print one line per key (in the order the client returned them). */
    static void report(Op op, String keyName, long t0, Map<String, ? extends KafkaFuture<?>> futures,
                       String version, Extra extra) throws InterruptedException {
        Map<String, Long> done = new ConcurrentHashMap<>();
        for (Map.Entry<String, ? extends KafkaFuture<?>> e : futures.entrySet()) {
            String key = e.getKey();
            e.getValue().whenComplete((v, err) -> done.put(key, System.nanoTime()));
        }
        Map<String, Object> values = new HashMap<>();
        Map<String, Throwable> errors = new HashMap<>();
        for (Map.Entry<String, ? extends KafkaFuture<?>> e : futures.entrySet()) {
            try {
                values.put(e.getKey(), e.getValue().get());
            } catch (ExecutionException ex) {
                errors.put(e.getKey(), ex.getCause() == null ? ex : ex.getCause());
            }
        }
        long now = System.nanoTime();
        long elapsed = ms(now - t0);
        for (String key : new java.util.TreeSet<>(futures.keySet())) {
            Throwable err = errors.get(key);
            String more = err == null && extra != null ? extra.json(values.get(key)) : null;
            println(line(op, keyName, key, err, elapsed, ms(done.getOrDefault(key, now) - t0), version, more));
        }
    }

    static String line(Op op, String keyName, String key, Throwable err, long elapsed, long doneMs,
                       String version, String more) {
        StringBuilder sb = new StringBuilder("{");
        sb.append("\"op\":").append(str(op.name));
        sb.append(',').append(str(keyName)).append(':').append(str(key));
        sb.append(",\"outcome\":").append(str(err == null ? "ok" : err.getClass().getSimpleName()));
        sb.append(",\"message\":").append(err == null ? "null" : str(err.getMessage()));
        sb.append(",\"elapsed_ms\":").append(elapsed);
        sb.append(",\"done_ms\":").append(doneMs);
        sb.append(",\"client_version\":").append(str(version));
        if (more != null) sb.append(',').append(more);
        return sb.append('}').toString();
    }

    static void println(String s) {
        System.out.println(s);
        System.out.flush();
    }

    static long ms(long nanos) { return Math.round(nanos / 1e6); }

    /** "user=alice,client-id=<default>" -> {user: alice, client-id: null} (null = default entity). */
    static Map<String, String> entityMap(String spec) {
        Map<String, String> m = new LinkedHashMap<>();
        for (String part : spec.split(",")) {
            int eq = part.indexOf('=');
            if (eq <= 0) throw new IllegalArgumentException("entity wants type=name[,type=name], got " + spec);
            String name = part.substring(eq + 1);
            m.put(part.substring(0, eq), name.equals(DEFAULT) ? null : name);
        }
        return m;
    }

    static String entityString(Map<String, String> entries) {
        StringBuilder sb = new StringBuilder();
        List<String> keys = new ArrayList<>(entries.keySet());
        // user before client-id (the order Kafka's own tools print), anything else after.
        keys.sort((a, b) -> Integer.compare(rank(a), rank(b)) != 0 ? Integer.compare(rank(a), rank(b)) : a.compareTo(b));
        for (String k : keys) {
            if (sb.length() > 0) sb.append(',');
            String v = entries.get(k);
            sb.append(k).append('=').append(v == null ? DEFAULT : v);
        }
        return sb.toString();
    }

    static int rank(String entityType) {
        return entityType.equals("user") ? 0 : entityType.equals("client-id") ? 1 : 2;
    }

    // ------------------------------------------------------------------ JSON

    static String num(Double d) {
        if (d == null || d.isNaN() || d.isInfinite()) return "null";
        if (d == Math.rint(d) && Math.abs(d) < 1e15) return Long.toString(d.longValue());
        return Double.toString(d);
    }

    static String str(String s) {
        if (s == null) return "null";
        StringBuilder sb = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                case '\b': sb.append("\\b"); break;
                case '\f': sb.append("\\f"); break;
                default:
                    if (c < 0x20 || c == 0x2028 || c == 0x2029) sb.append(String.format("\\u%04x", (int) c));
                    else sb.append(c);
            }
        }
        return sb.append('"').toString();
    }
}
