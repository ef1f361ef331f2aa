// AdminProbe's client-version shim for kafka-clients >= 3.1 (2.7+ for the quota options):
// DeleteTopicsResult/DescribeTopicsResult.values() were replaced by topicNameValues() (removed in 4.0).
import java.util.Map;

import org.apache.kafka.clients.admin.CreatePartitionsOptions;
import org.apache.kafka.clients.admin.CreateTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsOptions;
import org.apache.kafka.clients.admin.DeleteTopicsResult;
import org.apache.kafka.clients.admin.DescribeTopicsResult;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.KafkaFuture;

final class AdminCompat {
    static final String FLAVOR = "new";

    private AdminCompat() {}

    static Map<String, KafkaFuture<Void>> byName(DeleteTopicsResult r) { return r.topicNameValues(); }

    static Map<String, KafkaFuture<TopicDescription>> byName(DescribeTopicsResult r) { return r.topicNameValues(); }

    // KIP-599: the Admin client retries ThrottlingQuotaExceededException until its timeout unless told not to.
    static void noRetryOnQuota(CreateTopicsOptions o) { o.retryOnQuotaViolation(false); }

    static void noRetryOnQuota(CreatePartitionsOptions o) { o.retryOnQuotaViolation(false); }

    static void noRetryOnQuota(DeleteTopicsOptions o) { o.retryOnQuotaViolation(false); }
}
