package io.monsoon.platform;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The metric names and labels monsoon scrapes (its contract with the platform), in Prometheus' text format. */
class MetricsTest {
    private static List<String> scrape() throws Exception {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        Metrics.write(out);
        return Arrays.asList(out.toString(StandardCharsets.UTF_8).split("\n"));
    }

    /** The value of the one sample whose line starts with {@code series} (name, or name{labels) and has all {@code labels}. */
    private static double value(List<String> lines, String name, String... labels) {
        List<String> m = lines.stream()
            .filter(l -> l.startsWith(name + " ") || l.startsWith(name + "{"))
            .filter(l -> Arrays.stream(labels).allMatch(l::contains)).toList();
        assertEquals(1, m.size(), name + " " + Arrays.toString(labels) + ": " + m);
        String l = m.get(0);
        return Double.parseDouble(l.substring(l.lastIndexOf(' ') + 1));
    }

    @Test
    void theContractsSeriesAreExportedAndCount() throws Exception {
        Metrics.init(() -> 42.0, () -> 7.0);
        Metrics.initRegistry("near", "sql");
        double received = Metrics.RECEIVED.get();
        Metrics.RECEIVED.inc(3);
        Metrics.ACKED.inc();
        Metrics.REGISTRY_LOOKUPS.labelValues("sql", "miss").inc(2);
        List<String> lines = scrape();
        assertTrue(Metrics.contentType().startsWith("text/plain"), Metrics.contentType());
        assertEquals(received + 3, value(lines, "tb_messages_received_total"));
        assertTrue(value(lines, "tb_messages_acked_total") >= 1);
        for (String n : new String[]{"tb_messages_stored_total", "tb_messages_errors_total"}) value(lines, n);
        assertEquals(42.0, value(lines, "tb_queue_size"), "the gauge reads the queue's size when scraped");
        assertEquals(7.0, value(lines, "tb_kafka_consumer_lag"));
        // the registry hops in use exist before the first lookup, as 0; the near cache has no latency or errors
        assertEquals(0.0, value(lines, "tb_registry_lookups_total", "source=\"near\"", "result=\"hit\""));
        assertEquals(2.0, value(lines, "tb_registry_lookups_total", "source=\"sql\"", "result=\"miss\""));
        assertEquals(0.0, value(lines, "tb_registry_errors_total", "source=\"sql\"", "cause=\"timeout\""));
        assertEquals(0.0, value(lines, "tb_registry_lookup_seconds_count", "source=\"sql\""));
        assertTrue(lines.stream().noneMatch(l -> l.startsWith("tb_registry_errors_total{") && l.contains("\"near\"")));
        for (String kind : new String[]{"connect", "message", "http"}) {
            assertEquals(0.0, value(lines, "tb_registry_refused_total", "kind=\"" + kind + "\""));
        }
        assertTrue(lines.stream().anyMatch(l -> l.startsWith("jvm_memory_used_bytes")), "the JVM's own metrics");
    }
}
