package io.monsoon.platform;

import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
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

    static String contentType() {
        return PrometheusTextFormatWriter.CONTENT_TYPE;
    }

    static void write(OutputStream out) throws IOException {
        WRITER.write(out, PrometheusRegistry.defaultRegistry.scrape());
    }
}
