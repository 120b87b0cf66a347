package io.monsoon.platform;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;

/** The search-by-filter endpoint's filters, as each registry (Postgres, Mongo) builds them. */
class DeviceSearchTest {
    @Test
    void sqlFiltersByNameSubstringAndTypeEachWhenGiven() {
        List<String> args = new ArrayList<>();
        assertEquals(" WHERE name ILIKE ? AND type = ?", SqlDeviceStore.where("dev-01", "sensor", args));
        assertEquals(List.of("%dev-01%", "sensor"), args);
        args.clear();
        assertEquals(" WHERE type = ?", SqlDeviceStore.where("", "sensor", args));
        assertEquals(List.of("sensor"), args);
        args.clear();
        assertEquals("", SqlDeviceStore.where(null, null, args));
        assertEquals(List.of(), args);
    }

    @Test
    void mongoFiltersByQuotedCaseInsensitiveRegexAndExactType() {
        String both = MongoDeviceStore.filter("a.b", "sensor").toBsonDocument().toJson();
        assertEquals("{\"$and\": [{\"name\": {\"$regularExpression\": {\"pattern\": \"\\\\Qa.b\\\\E\", "
            + "\"options\": \"i\"}}}, {\"type\": \"sensor\"}]}", both);
        assertEquals("{\"type\": \"sensor\"}", MongoDeviceStore.filter(null, "sensor").toBsonDocument().toJson());
        assertEquals("{}", MongoDeviceStore.filter("", "").toBsonDocument().toJson());
    }
}
