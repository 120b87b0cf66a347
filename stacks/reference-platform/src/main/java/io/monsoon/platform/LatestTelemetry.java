package io.monsoon.platform;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import javax.sql.DataSource;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.UUID;

/**
 * Reads of a device's latest telemetry from the store (ts_kv_latest, kept in Postgres in both storage modes),
 * in ThingsBoard's shape: {@code GET /api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=a,b} answers
 * {@code {"a":[{"ts":..,"value":"42"}],"b":[..]}}, values as strings (TB's default, useStrictDataTypes=false)
 * unless {@code useStrictDataTypes=true}; a key with no value is left out; no {@code keys}: every key.
 */
final class LatestTelemetry {
    private LatestTelemetry() {
    }

    /** The {@code keys} parameter: comma-separated, blanks dropped, duplicates once, in order; empty = every key. */
    static List<String> keys(String param) {
        LinkedHashSet<String> out = new LinkedHashSet<>();
        if (param != null) {
            for (String k : param.split(",")) {
                String t = k.trim();
                if (!t.isEmpty()) out.add(t);
            }
        }
        return new ArrayList<>(out);
    }

    /** The answer for these entries (one per key, as ts_kv_latest holds them), keys in the order given. */
    static ObjectNode json(List<KvEntry> entries, boolean strict) {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        for (KvEntry e : entries) {
            ArrayNode a = n.has(e.key) ? (ArrayNode) n.get(e.key) : n.putArray(e.key);
            ObjectNode v = a.addObject();
            v.put("ts", e.ts);
            if (!strict) {
                v.put("value", String.valueOf(e.value));
                continue;
            }
            switch (e.type) {
                case BOOLEAN -> v.put("value", (Boolean) e.value);
                case LONG -> v.put("value", (Long) e.value);
                case DOUBLE -> v.put("value", (Double) e.value);
                default -> v.put("value", (String) e.value);
            }
        }
        return n;
    }

    /** The SELECT for these keys ({@code ?} = the device id, then one per key); every key when none is given. */
    static String sql(int nKeys) {
        StringBuilder sb = new StringBuilder("SELECT k.key, l.ts, l.bool_v, l.str_v, l.long_v, l.dbl_v, l.json_v"
            + " FROM ts_kv_latest l JOIN key_dictionary k ON k.key_id = l.key WHERE l.entity_id = ?");
        if (nKeys > 0) {
            sb.append(" AND k.key IN (");
            for (int i = 0; i < nKeys; i++) sb.append(i == 0 ? "?" : ", ?");
            sb.append(')');
        }
        return sb.append(" ORDER BY k.key").toString();
    }

    /** The device's latest values of {@code keys} (all when empty), ordered as asked (else by key). */
    static List<KvEntry> read(DataSource ds, UUID deviceId, List<String> keys) throws SQLException {
        List<KvEntry> out = new ArrayList<>();
        try (Connection c = ds.getConnection(); PreparedStatement ps = c.prepareStatement(sql(keys.size()))) {
            ps.setObject(1, deviceId);
            for (int i = 0; i < keys.size(); i++) ps.setString(i + 2, keys.get(i));
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) out.add(entry(rs));
            }
        }
        if (!keys.isEmpty()) out.sort((a, b) -> Integer.compare(keys.indexOf(a.key), keys.indexOf(b.key)));
        return out;
    }

    private static KvEntry entry(ResultSet rs) throws SQLException {
        String key = rs.getString(1);
        long ts = rs.getLong(2);
        boolean b = rs.getBoolean(3);
        if (!rs.wasNull()) return new KvEntry(key, ts, KvEntry.Type.BOOLEAN, b);
        String s = rs.getString(4);
        if (s != null) return new KvEntry(key, ts, KvEntry.Type.STRING, s);
        long l = rs.getLong(5);
        if (!rs.wasNull()) return new KvEntry(key, ts, KvEntry.Type.LONG, l);
        double d = rs.getDouble(6);
        if (!rs.wasNull()) return new KvEntry(key, ts, KvEntry.Type.DOUBLE, d);
        return new KvEntry(key, ts, KvEntry.Type.JSON, rs.getString(7));
    }
}
