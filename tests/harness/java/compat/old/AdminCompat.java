// AdminProbe's client-version shim for kafka-clients 2.6.x (pre KIP-599).
// Results are keyed by values(); there is no retryOnQuotaViolation (the client never sees the
// THROTTLING_QUOTA_EXCEEDED error: it speaks CreateTopics v5 / CreatePartitions v2 / DeleteTopics v4,
// for which brokers throttle by delaying the response instead), so the option is a no-op.
import java.util.Map;

import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsResult;
import org.apache.kafka.clients.admin.DescribeTopicsResult;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.KafkaFuture;

final class AdminCompat {
    static final String FLAVOR = "old";

    private AdminCompat() {}

    static Map<String, KafkaFuture<Void>> byName(DeleteTopicsResult r) { return r.values(); }

    static Map<String, KafkaFuture<TopicDescription>> byName(DescribeTopicsResult r) { return r.values(); }

    static void noRetryOnQuota(CreateTopicsOptions o) {}

    static void noRetryOnQuota(CreatePartitionsOptions o) {}

    static void noRetryOnQuota(DeleteTopicsOptions o) {}
}
