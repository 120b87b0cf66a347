package io.monsoon.platform;

import com.fasterxml.jackson.databind.node.ObjectNode;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The read-by-id endpoint's pure parts: the keys parameter, the SELECT, and ThingsBoard's answer shape. */
class LatestTelemetryTest {
    @Test
    void keysAreCommaSeparatedTrimmedAndOnce() {
        assertEquals(List.of("seq", "temp"), LatestTelemetry.keys(" seq, temp ,,seq"));
        assertTrue(LatestTelemetry.keys(null).isEmpty());
        assertTrue(LatestTelemetry.keys(" , ").isEmpty());
    }

    @Test
    void theSelectHasOnePlaceholderPerKeyAndNoneForAll() {
        String two = LatestTelemetry.sql(2);
        assertTrue(two.contains("k.key IN (?, ?)"), two);
        assertEquals(3, two.chars().filter(c -> c == '?').count(), two);
        String all = LatestTelemetry.sql(0);
        assertEquals(1, all.chars().filter(c -> c == '?').count(), all);
        assertTrue(all.contains("FROM ts_kv_latest"), all);
    }

    @Test
    void valuesAreStringsAsThingsBoardAnswersUnlessStrict() throws Exception {
        List<KvEntry> es = new ArrayList<>();
        es.add(new KvEntry("seq", 1000L, KvEntry.Type.LONG, 42L));
        es.add(new KvEntry("on", 1001L, KvEntry.Type.BOOLEAN, true));
        es.add(new KvEntry("t", 1002L, KvEntry.Type.DOUBLE, 21.5));
        ObjectNode loose = LatestTelemetry.json(es, false);
        assertEquals("{\"seq\":[{\"ts\":1000,\"value\":\"42\"}],\"on\":[{\"ts\":1001,\"value\":\"true\"}],"
            + "\"t\":[{\"ts\":1002,\"value\":\"21.5\"}]}", TelemetryParser.MAPPER.writeValueAsString(loose));
        ObjectNode strict = LatestTelemetry.json(es, true);
        assertEquals(42L, strict.get("seq").get(0).get("value").asLong());
        assertTrue(strict.get("on").get(0).get("value").isBoolean());
        assertTrue(strict.get("t").get(0).get("value").isDouble());
        assertEquals("{}", TelemetryParser.MAPPER.writeValueAsString(LatestTelemetry.json(List.of(), false)));
    }

    @Test
    void metricsAndHealthNeverQueueBehindTheApi() {
        assertTrue(HttpApi.monitoring("/metrics") && HttpApi.monitoring("/health"));
        assertTrue(!HttpApi.monitoring("/api/tenant/devices") && !HttpApi.monitoring("/metrics/x"));
    }
}
