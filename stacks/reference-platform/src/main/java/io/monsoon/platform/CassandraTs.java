package io.monsoon.platform;

import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.config.DefaultDriverOption;
import com.datastax.oss.driver.api.core.config.DriverConfigLoader;
import com.datastax.oss.driver.api.core.cql.AsyncResultSet;
import com.datastax.oss.driver.api.core.cql.BoundStatement;
import com.datastax.oss.driver.api.core.cql.PreparedStatement;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.net.InetSocketAddress;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * DATABASE_TS_TYPE=cassandra: time series in ThingsBoard's Cassandra layout, written asynchronously through the
 * DataStax Java driver 4.x. Tables (as TB's schema-ts.cql): {@code ts_kv_cf} partitioned by
 * (entity_type, entity_id, key, partition) and clustered by ts, one typed value column set; the partition is the
 * start of the value's UTC month in ms (TS_KV_PARTITIONING=MONTHS); {@code ts_kv_partitions_cf} lists the
 * partitions of each (entity, key). One deviation: entity_id is {@code uuid}, not {@code timeuuid}, because this
 * platform's device ids are random (version 4) UUIDs.
 *
 * <p>Connection pool: CASSANDRA_MAX_REQUESTS_PER_CONNECTION requests may be in flight on each of the
 * CASSANDRA_CONNECTIONS connections. Driver 3.x (NDU's) made a caller wait in
 * {@code HostConnectionPool.awaitAvailableConnection} when every connection was full, for up to the pool timeout;
 * driver 4.x fails fast with BusyConnectionException instead. {@link #awaitAvailableConnection()} keeps the 3.x
 * behaviour (one permit per in-flight request, the caller blocks, CASSANDRA_POOL_TIMEOUT_MS), so a low limit
 * shows up in a thread dump exactly where NDU's did.
 */
final class CassandraTs implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger(CassandraTs.class);
    private static final String ENTITY_TYPE = "DEVICE";

    private final Config cfg;
    private CqlSession session;
    private PreparedStatement insertTs;
    private PreparedStatement insertPartition;
    private final Semaphore permits;
    private final Set<String> partitionsWritten = ConcurrentHashMap.newKeySet();

    CassandraTs(Config cfg) {
        this.cfg = cfg;
        this.permits = new Semaphore(cfg.cassandraMaxRequestsPerConnection * cfg.cassandraConnections);
    }

    /** Connects (bounded wait), creates the keyspace and tables if absent, prepares the statements. */
    void start(int timeoutSec) {
        DriverConfigLoader loader = DriverConfigLoader.programmaticBuilder()
            .withInt(DefaultDriverOption.CONNECTION_POOL_LOCAL_SIZE, cfg.cassandraConnections)
            // the driver's own limit sits above ours: the wait happens in awaitAvailableConnection, never a Busy error
            .withInt(DefaultDriverOption.CONNECTION_MAX_REQUESTS, cfg.cassandraMaxRequestsPerConnection + 16)
            .withDuration(DefaultDriverOption.REQUEST_TIMEOUT, Duration.ofMillis(cfg.cassandraRequestTimeoutMs))
            .withDuration(DefaultDriverOption.CONNECTION_CONNECT_TIMEOUT, Duration.ofSeconds(5))
            .withDuration(DefaultDriverOption.CONNECTION_INIT_QUERY_TIMEOUT, Duration.ofSeconds(5))
            .withDuration(DefaultDriverOption.CONTROL_CONNECTION_TIMEOUT, Duration.ofSeconds(5))
            .withDuration(DefaultDriverOption.METADATA_SCHEMA_REQUEST_TIMEOUT, Duration.ofSeconds(10))
            .withDuration(DefaultDriverOption.RECONNECTION_BASE_DELAY, Duration.ofMillis(200))
            .withDuration(DefaultDriverOption.RECONNECTION_MAX_DELAY, Duration.ofSeconds(2))
            .withString(DefaultDriverOption.REQUEST_CONSISTENCY, cfg.cassandraWriteConsistency)
            .withBoolean(DefaultDriverOption.RECONNECT_ON_INIT, false)
            .build();
        long deadline = System.nanoTime() + timeoutSec * 1_000_000_000L;
        int attempt = 0;
        while (session == null) {
            attempt++;
            try {
                var b = CqlSession.builder().withConfigLoader(loader).withLocalDatacenter(cfg.cassandraLocalDc);
                for (InetSocketAddress a : cfg.cassandraContactPoints) b.addContactPoint(a);
                session = b.build();
            } catch (RuntimeException e) {
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("cannot connect to Cassandra at " + cfg.cassandraContactPoints
                        + " within " + timeoutSec + " s: " + e.getMessage(), e);
                }
                if (attempt == 1 || attempt % 5 == 0) {
                    log.warn("Cassandra not reachable at {} yet ({}); retrying", cfg.cassandraContactPoints, e.getMessage());
                }
                Db.sleep(1000);
            }
        }
        String ks = cfg.cassandraKeyspace;
        session.execute("CREATE KEYSPACE IF NOT EXISTS " + ks
            + " WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}");
        session.execute("CREATE TABLE IF NOT EXISTS " + ks + ".ts_kv_cf (entity_type text, entity_id uuid, key text,"
            + " partition bigint, ts bigint, bool_v boolean, str_v text, long_v bigint, dbl_v double, json_v text,"
            + " PRIMARY KEY ((entity_type, entity_id, key, partition), ts))");
        session.execute("CREATE TABLE IF NOT EXISTS " + ks + ".ts_kv_partitions_cf (entity_type text, entity_id uuid,"
            + " key text, partition bigint, PRIMARY KEY ((entity_type, entity_id, key), partition))"
            + " WITH CLUSTERING ORDER BY (partition ASC)"
            + " AND compaction = {'class': 'LeveledCompactionStrategy'}");
        insertTs = session.prepare("INSERT INTO " + ks + ".ts_kv_cf (entity_type, entity_id, key, partition, ts,"
            + " bool_v, str_v, long_v, dbl_v, json_v) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        insertPartition = session.prepare("INSERT INTO " + ks + ".ts_kv_partitions_cf (entity_type, entity_id, key,"
            + " partition) VALUES (?, ?, ?, ?)");
        log.info("Cassandra time series ready: keyspace {} at {}, {} connection(s) x {} requests, pool timeout {} ms",
            ks, cfg.cassandraContactPoints, cfg.cassandraConnections, cfg.cassandraMaxRequestsPerConnection,
            cfg.cassandraPoolTimeoutMs);
    }

    /** The start of ts's UTC month, in ms: TB's MONTHS partitioning. */
    static long monthPartition(long ts) {
        ZonedDateTime t = Instant.ofEpochMilli(ts).atZone(ZoneOffset.UTC);
        return t.withDayOfMonth(1).toLocalDate().atStartOfDay(ZoneOffset.UTC).toInstant().toEpochMilli();
    }

    /**
     * Blocks until a request may be sent (a permit of the connection pool), at most the pool timeout: the
     * counterpart of driver 3.x's HostConnectionPool.awaitAvailableConnection.
     */
    void awaitAvailableConnection() throws InterruptedException, TimeoutException {
        if (!permits.tryAcquire(cfg.cassandraPoolTimeoutMs, TimeUnit.MILLISECONDS)) {
            throw new TimeoutException("no Cassandra connection available within " + cfg.cassandraPoolTimeoutMs
                + " ms (" + cfg.cassandraConnections + " x " + cfg.cassandraMaxRequestsPerConnection + " in flight)");
        }
    }

    private CompletionStage<AsyncResultSet> send(BoundStatement st) {
        try {
            awaitAvailableConnection();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return CompletableFuture.failedFuture(e);
        } catch (TimeoutException e) {
            return CompletableFuture.failedFuture(e);
        }
        CompletionStage<AsyncResultSet> f;
        try {
            f = session.executeAsync(st);
        } catch (RuntimeException e) {
            permits.release();
            return CompletableFuture.failedFuture(e);
        }
        return f.whenComplete((r, t) -> permits.release());
    }

    /** Writes every value of the message asynchronously; the future completes when all are written. */
    CompletableFuture<Void> saveAsync(TbMsg m) {
        List<CompletableFuture<?>> fs = new ArrayList<>(m.entries.size() * 2);
        addWrites(m, fs);
        return CompletableFuture.allOf(fs.toArray(new CompletableFuture[0]));
    }

    /** Writes a consumer batch: every value sent asynchronously, then waits for all (throws on any failure). */
    void write(List<TbMsg> batch) throws Exception {
        List<CompletableFuture<?>> fs = new ArrayList<>(batch.size() * 2);
        for (TbMsg m : batch) addWrites(m, fs);
        try {
            CompletableFuture.allOf(fs.toArray(new CompletableFuture[0])).get();
        } catch (java.util.concurrent.ExecutionException e) {
            Throwable c = e.getCause() == null ? e : e.getCause();
            throw c instanceof Exception ex ? ex : new RuntimeException(c);
        }
    }

    private void addWrites(TbMsg m, List<CompletableFuture<?>> fs) {
        for (KvEntry e : m.entries) {
            long partition = monthPartition(e.ts);
            String pk = m.deviceId + "|" + e.key + "|" + partition;
            if (!partitionsWritten.contains(pk)) {
                fs.add(send(insertPartition.bind(ENTITY_TYPE, m.deviceId, e.key, partition)).toCompletableFuture()
                    .thenRun(() -> partitionsWritten.add(pk)));
            }
            fs.add(send(bind(m.deviceId, partition, e)).toCompletableFuture());
        }
    }

    /** Only the value's own column is bound: the others stay unset (a bound null would write a tombstone). */
    private BoundStatement bind(UUID entityId, long partition, KvEntry e) {
        var b = insertTs.boundStatementBuilder()
            .setString(0, ENTITY_TYPE).setUuid(1, entityId).setString(2, e.key).setLong(3, partition).setLong(4, e.ts);
        switch (e.type) {
            case BOOLEAN -> b.setBoolean(5, (Boolean) e.value);
            case STRING -> b.setString(6, (String) e.value);
            case LONG -> b.setLong(7, (Long) e.value);
            case DOUBLE -> b.setDouble(8, (Double) e.value);
            case JSON -> b.setString(9, (String) e.value);
        }
        return b.build();
    }

    /** Requests in flight (permits taken). */
    long inFlight() {
        return (long) cfg.cassandraMaxRequestsPerConnection * cfg.cassandraConnections - permits.availablePermits();
    }

    @Override
    public void close() {
        if (session != null) session.close();
    }
}
