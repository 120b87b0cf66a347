package io.monsoon.platform;

import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** ThingsBoard's three telemetry formats, each value type, and every refusal with its message. */
class TelemetryParserTest {
    private static final long NOW = 1_700_000_000_000L;

    private static KvEntry only(List<KvEntry> es, String key) {
        List<KvEntry> m = es.stream().filter(e -> e.key.equals(key)).toList();
        assertEquals(1, m.size(), "entries for " + key + ": " + m.size());
        return m.get(0);
    }

    @Test
    void aFlatObjectTakesTheServerTimeAndTypesEachValue() throws Exception {
        List<KvEntry> es = TelemetryParser.parse(
            "{\"b\":true,\"n\":42,\"x\":1.5,\"s\":\"hi\",\"o\":{\"a\":[1,2]},\"gone\":null,\"big\":123456789012345678901234}",
            NOW);
        assertEquals(6, es.size(), "null values are skipped");
        assertTrue(es.stream().allMatch(e -> e.ts == NOW));
        assertEquals(KvEntry.Type.BOOLEAN, only(es, "b").type);
        assertEquals(Boolean.TRUE, only(es, "b").value);
        assertEquals(KvEntry.Type.LONG, only(es, "n").type);
        assertEquals(42L, only(es, "n").value);
        assertEquals(KvEntry.Type.DOUBLE, only(es, "x").type);
        assertEquals(1.5, only(es, "x").value);
        assertEquals(KvEntry.Type.STRING, only(es, "s").type);
        assertEquals("hi", only(es, "s").value);
        assertEquals(KvEntry.Type.JSON, only(es, "o").type);
        assertEquals("{\"a\":[1,2]}", only(es, "o").value);
        // an integer too big for a long is stored as a double, not refused or wrapped
        assertEquals(KvEntry.Type.DOUBLE, only(es, "big").type);
        assertEquals(1.2345678901234568e23, (Double) only(es, "big").value, 1e9);
    }

    @Test
    void tsAndValuesSetTheTimestampAsANumberOrText() throws Exception {
        List<KvEntry> es = TelemetryParser.parse("{\"ts\":1000,\"values\":{\"t\":21}}", NOW);
        assertEquals(1, es.size());
        assertEquals(1000L, es.get(0).ts);
        assertEquals(1001L, TelemetryParser.parse("{\"ts\":\"1001\",\"values\":{\"t\":1}}", NOW).get(0).ts);
        // without "values" a "ts" key is an ordinary value at the server's time
        List<KvEntry> plain = TelemetryParser.parse("{\"ts\":5,\"t\":1}", NOW);
        assertEquals(2, plain.size());
        assertTrue(plain.stream().allMatch(e -> e.ts == NOW));
    }

    @Test
    void anArrayMixesBothForms() throws Exception {
        List<KvEntry> es = TelemetryParser.parse("[{\"ts\":1,\"values\":{\"a\":1}},{\"b\":2},{\"ts\":3,\"values\":{\"a\":3}}]", NOW);
        assertEquals(List.of(1L, NOW, 3L), es.stream().map(e -> e.ts).toList());
        assertEquals(List.of("a", "b", "a"), es.stream().map(e -> e.key).toList());
        assertEquals(0, TelemetryParser.parse("[]", NOW).size());
    }

    private static String refusal(String json) {
        return assertThrows(TelemetryParser.InvalidPayload.class, () -> TelemetryParser.parse(json, NOW)).getMessage();
    }

    @Test
    void badPayloadsAreRefusedWithAReason() {
        assertTrue(refusal("{\"a\":").startsWith("invalid JSON: "), refusal("{\"a\":"));
        assertEquals("empty payload", refusal(""));
        assertEquals("payload must be a JSON object or array", refusal("42"));
        assertEquals("array elements must be JSON objects", refusal("[{\"a\":1}, 2]"));
        assertEquals("'ts' must be an integer (ms)", refusal("{\"ts\":1.5,\"values\":{\"a\":1}}"));
        assertEquals("'ts' must be an integer (ms)", refusal("{\"ts\":\"soon\",\"values\":{\"a\":1}}"));
        assertEquals("'values' must be a JSON object", refusal("{\"ts\":1,\"values\":[1]}"));
        assertEquals("invalid key ''", refusal("{\"\":1}"));
        assertTrue(refusal("{\"" + "k".repeat(256) + "\":1}").startsWith("invalid key 'kkk"));
    }

    @Test
    void toMsgCarriesTheDeviceTheRawTextAndTheEntries() throws Exception {
        DeviceService.DeviceInfo dev = new DeviceService.DeviceInfo(UUID.randomUUID(), "dev-1", "sensor");
        String json = "{\"seq\":7}";
        TbMsg m = TelemetryParser.toMsg(dev, json, NOW);
        assertEquals(dev.id, m.deviceId);
        assertEquals("dev-1", m.deviceName);
        assertEquals(json, m.data);
        assertEquals(NOW, m.serverTs);
        assertEquals("dev-1", m.metadata.get("deviceName"));
        assertEquals("sensor", m.metadata.get("deviceType"));
        assertEquals(Long.toString(NOW), m.metadata.get("ts"));
        assertEquals(7L, only(m.entries, "seq").value);
    }
}
