package io.monsoon.platform;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.core.metrics.Summary;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.instrumentation.jvm.JvmMetrics;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.io.IOException;
import java.io.OutputStream;
import java.util.function.DoubleSupplier;

/** The platform's Prometheus metrics (names are part of the monsoon contract). */
final class Metrics {
    static final Counter RECEIVED = Counter.builder().name("tb_messages_received_total")
            .help("Telemetry messages received from devices (MQTT PUBLISH or HTTP POST on a telemetry endpoint)")
            .withoutExemplars().register();
    static final Counter ACKED = Counter.builder().name("tb_messages_acked_total")
            .help("Telemetry messages accepted into the queue (PUBACK / HTTP 200 sent; QoS0 counted when enqueued)")
            .withoutExemplars().register();
    static final Counter STORED = Counter.builder().name("tb_messages_stored_total")
            .help("Telemetry messages whose Postgres transaction committed")
            .withoutExemplars().register();
    static final Counter ERRORS = Counter.builder().name("tb_messages_errors_total")
            .help("Errors: invalid payloads, queue (Kafka) send failures, failed storage attempts (per message)")
            .withoutExemplars().register();
    // ---- device registry / cache lookups (DeviceLookup)
    static final Counter REGISTRY_LOOKUPS = Counter.builder().name("tb_registry_lookups_total")
            .help("Device lookups per hop of the chain near cache -> Infinispan -> registry; source=near|infinispan|mongo|sql,"
                + " result=hit|miss (a registry miss is an unknown token or device)")
            .labelNames("source", "result").withoutExemplars().register();
    static final Summary REGISTRY_LOOKUP_SECONDS = Summary.builder().name("tb_registry_lookup_seconds")
            .help("Latency of one remote lookup hop (source=infinispan|mongo|sql), successful or not;"
                + " quantiles over a sliding 60 s window")
            .labelNames("source").quantile(0.5, 0.01).quantile(0.9, 0.01).quantile(0.99, 0.001)
            .maxAgeSeconds(60).numberOfAgeBuckets(6).withoutExemplars().register();
    static final Counter REGISTRY_ERRORS = Counter.builder().name("tb_registry_errors_total")
            .help("Failed lookup hops: cause=error (exception) or timeout (REGISTRY_TIMEOUT_MS expired while waiting on"
                + " that hop; source=queue when still waiting for a lookup thread); infinispan errors fall through to the"
                + " registry, registry errors and timeouts refuse the connection / message / request")
            .labelNames("source", "cause").withoutExemplars().register();
    static final Counter REGISTRY_REFUSED = Counter.builder().name("tb_registry_refused_total")
            .help("Connections (kind=connect), MQTT messages (kind=message) and HTTP requests (kind=http) refused because"
                + " a device lookup failed or timed out")
            .labelNames("kind").withoutExemplars().register();

    private static final PrometheusTextFormatWriter WRITER = new PrometheusTextFormatWriter(false);

    private Metrics() {
    }

    static void init(DoubleSupplier queueSize, DoubleSupplier kafkaLag) {
        GaugeWithCallback.builder().name("tb_queue_size")
                .help("Messages acked but not yet stored (in-memory: queue depth; kafka: produced minus stored in this process)")
                .callback(cb -> cb.call(queueSize.getAsDouble())).register();
        if (kafkaLag != null) {
            GaugeWithCallback.builder().name("tb_kafka_consumer_lag")
                    .help("Consumer lag (log end offset minus position) summed over the partitions assigned to this process")
                    .callback(cb -> cb.call(kafkaLag.getAsDouble())).register();
        }
        JvmMetrics.builder().register();
    }

    /** Pre-creates the label combinations of the hops in use, so they are exported (as 0) before the first lookup. */
    static void initRegistry(String... sources) {
        for (String s : sources) {
            REGISTRY_LOOKUPS.labelValues(s, "hit");
            REGISTRY_LOOKUPS.labelValues(s, "miss");
            if (!s.equals("near")) {
                REGISTRY_LOOKUP_SECONDS.labelValues(s);
                REGISTRY_ERRORS.labelValues(s, "error");
                REGISTRY_ERRORS.labelValues(s, "timeout");
            }
        }
        for (String k : new String[]{"connect", "message", "http"}) REGISTRY_REFUSED.labelValues(k);
    }

    static String contentType() {
        return PrometheusTextFormatWriter.CONTENT_TYPE;
    }

    static void write(OutputStream out) throws IOException {
        WRITER.write(out, PrometheusRegistry.defaultRegistry.scrape());
    }
}
