package io.monsoon.platform;

import javax.sql.DataSource;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The rule engine's "save timeseries" node: one consumer batch = one Postgres transaction holding a
 * JDBC batch of ts_kv upserts and a JDBC batch of ts_kv_latest upserts (latest only moves forward).
 */
final class TsWriter {
    private static final String TS_SQL =
        "INSERT INTO ts_kv (entity_id, key, ts, bool_v, str_v, long_v, dbl_v, json_v)"
            + " VALUES (?, ?, ?, ?, ?, ?, ?, cast(? AS json))"
            + " ON CONFLICT (entity_id, key, ts) DO UPDATE SET bool_v = EXCLUDED.bool_v, str_v = EXCLUDED.str_v,"
            + " long_v = EXCLUDED.long_v, dbl_v = EXCLUDED.dbl_v, json_v = EXCLUDED.json_v";
    private static final String LATEST_SQL =
        "INSERT INTO ts_kv_latest (entity_id, key, ts, bool_v, str_v, long_v, dbl_v, json_v)"
            + " VALUES (?, ?, ?, ?, ?, ?, ?, cast(? AS json))"
            + " ON CONFLICT (entity_id, key) DO UPDATE SET ts = EXCLUDED.ts, bool_v = EXCLUDED.bool_v,"
            + " str_v = EXCLUDED.str_v, long_v = EXCLUDED.long_v, dbl_v = EXCLUDED.dbl_v, json_v = EXCLUDED.json_v"
            + " WHERE ts_kv_latest.ts <= EXCLUDED.ts";

    /** DEFECT_DUPLICATE_ON_REDELIVERY: a plain insert into a ts_kv without primary key (not idempotent). */
    private static final String TS_SQL_NOT_IDEMPOTENT =
        "INSERT INTO ts_kv (entity_id, key, ts, bool_v, str_v, long_v, dbl_v, json_v)"
            + " VALUES (?, ?, ?, ?, ?, ?, ?, cast(? AS json))";

    private final DataSource ds;
    private final long commitDelayMs;
    private final Defects defects;
    private final String tsSql;
    private final Map<String, Integer> keyIds = new ConcurrentHashMap<>();
    /** DATABASE_TS_TYPE=cassandra: time series go to Cassandra, latest values stay here (TB's hybrid mode). */
    private CassandraTs cassandra;

    /**
     * @param commitDelayMs extra latency before each COMMIT (TB_STORAGE_COMMIT_DELAY_MS): models the commit
     *                      round trip of a production database (remote, fsync on, synchronous replica) that a
     *                      local fsync=off test Postgres does not have, so storage capacity is set by consumer
     *                      threads x batch size / transaction time rather than by how busy the host CPU is.
     */
    TsWriter(DataSource ds, long commitDelayMs) {
        this(ds, commitDelayMs, Defects.NONE);
    }

    /** @param defects seeded defects (DEFECT_*): (a) drop, (b) non-idempotent insert, (c) leak per message */
    TsWriter(DataSource ds, long commitDelayMs, Defects defects) {
        this.ds = ds;
        this.commitDelayMs = commitDelayMs;
        this.defects = defects;
        this.tsSql = defects.duplicateOnRedelivery ? TS_SQL_NOT_IDEMPOTENT : TS_SQL;
    }

    /** Sends the time series to Cassandra (asynchronously, joined per batch); ts_kv_latest stays in Postgres. */
    TsWriter withCassandra(CassandraTs ts) {
        this.cassandra = ts;
        return this;
    }

    private record Row(UUID entityId, int key, KvEntry e) {
    }

    private record TsKey(UUID entityId, int key, long ts) {
    }

    /** Writes the batch in one transaction; throws (and rolls back) on any database error. */
    void write(List<TbMsg> batch) throws SQLException {
        final int received = batch.size();
        batch = defects.dropSome(batch); // DEFECT_DROP_ACKED_PCT: acked, silently never written
        if (cassandra != null) {
            try {
                cassandra.write(batch); // before the latest values: a failed batch is retried whole (idempotent)
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new SQLException("interrupted while writing to Cassandra", e);
            } catch (Exception e) {
                throw new SQLException("Cassandra write failed: " + e.getMessage(), e);
            }
        }
        try (Connection c = ds.getConnection()) {
            // ts_kv rows keyed by primary key: the last value for the same (entity, key, ts) wins, as row by row.
            // ts_kv_latest gets one upsert per value, as TB's save-timeseries node does (no coalescing), sorted
            // by (entity, key) so concurrent consumers lock rows in the same order and cannot deadlock.
            Map<TsKey, Row> rows = new LinkedHashMap<>();
            List<Row> latestRows = new ArrayList<>();
            for (TbMsg m : batch) {
                for (KvEntry e : m.entries) {
                    int keyId = keyId(c, e.key);
                    Row r = new Row(m.deviceId, keyId, e);
                    rows.put(new TsKey(m.deviceId, keyId, e.ts), r);
                    latestRows.add(r);
                }
            }
            if (rows.isEmpty()) {
                defects.retain(received);
                return;
            }
            latestRows.sort(Comparator.comparing(Row::entityId).thenComparingInt(Row::key).thenComparingLong(r -> r.e.ts));
            c.setAutoCommit(false);
            try (PreparedStatement ts = c.prepareStatement(tsSql);
                 PreparedStatement lt = c.prepareStatement(LATEST_SQL)) {
                if (cassandra == null) {
                    for (Row r : rows.values()) {
                        bind(ts, r);
                        ts.addBatch();
                    }
                    ts.executeBatch();
                }
                for (Row r : latestRows) {
                    bind(lt, r);
                    lt.addBatch();
                }
                lt.executeBatch();
                if (commitDelayMs > 0) Thread.sleep(commitDelayMs);
                c.commit();
                defects.retain(received); // DEFECT_LEAK_BYTES_PER_MSG: an audit cache that is never evicted
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                c.rollback();
                throw new SQLException("interrupted before commit", ie);
            } catch (SQLException | RuntimeException ex) {
                try {
                    c.rollback();
                } catch (SQLException suppressed) {
                    ex.addSuppressed(suppressed);
                }
                throw ex;
            } finally {
                try {
                    c.setAutoCommit(true);
                } catch (SQLException ignored) {
                    // the pool discards broken connections
                }
            }
        }
    }

    private static void bind(PreparedStatement ps, Row r) throws SQLException {
        KvEntry e = r.e;
        ps.setObject(1, r.entityId);
        ps.setInt(2, r.key);
        ps.setLong(3, e.ts);
        if (e.type == KvEntry.Type.BOOLEAN) ps.setBoolean(4, (Boolean) e.value); else ps.setNull(4, Types.BOOLEAN);
        if (e.type == KvEntry.Type.STRING) ps.setString(5, (String) e.value); else ps.setNull(5, Types.VARCHAR);
        if (e.type == KvEntry.Type.LONG) ps.setLong(6, (Long) e.value); else ps.setNull(6, Types.BIGINT);
        if (e.type == KvEntry.Type.DOUBLE) ps.setDouble(7, (Double) e.value); else ps.setNull(7, Types.DOUBLE);
        if (e.type == KvEntry.Type.JSON) ps.setString(8, (String) e.value); else ps.setNull(8, Types.VARCHAR);
    }

    /** key_dictionary lookup with an in-memory cache; new keys are inserted in autocommit mode. */
    private int keyId(Connection c, String key) throws SQLException {
        Integer id = keyIds.get(key);
        if (id != null) return id;
        try (PreparedStatement ins = c.prepareStatement(
            "INSERT INTO key_dictionary (key) VALUES (?) ON CONFLICT (key) DO NOTHING")) {
            ins.setString(1, key);
            ins.executeUpdate();
        }
        try (PreparedStatement sel = c.prepareStatement("SELECT key_id FROM key_dictionary WHERE key = ?")) {
            sel.setString(1, key);
            try (ResultSet rs = sel.executeQuery()) {
                if (!rs.next()) throw new SQLException("key_dictionary has no row for " + key);
                int v = rs.getInt(1);
                keyIds.put(Objects.requireNonNull(key), v);
                return v;
            }
        }
    }
}
