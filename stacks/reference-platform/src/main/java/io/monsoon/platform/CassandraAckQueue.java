package io.monsoon.platform;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.concurrent.atomic.AtomicLong;

/**
 * TB_ACK_AFTER_TS_WRITE=true with DATABASE_TS_TYPE=cassandra (NDU's shape): no queue; each message is written to
 * Cassandra asynchronously and acked (PUBACK / HTTP 200) only when the write has succeeded. A failed write is
 * refused (no ack), so the device retries: nothing acked can be lost. The caller (the MQTT event loop) blocks in
 * {@link CassandraTs#awaitAvailableConnection()} while the connection pool is full. Latest values are not written
 * in this mode (NDU stored time series only).
 */
final class CassandraAckQueue implements TbQueue {
    private static final Logger log = LoggerFactory.getLogger(CassandraAckQueue.class);
    private static final RateLimitedLog failures = new RateLimitedLog(log, 5000);

    private final CassandraTs ts;
    private final Defects defects;
    private final AtomicLong pending = new AtomicLong();
    private volatile boolean running;

    CassandraAckQueue(CassandraTs ts, Defects defects) {
        this.ts = ts;
        this.defects = defects;
    }

    @Override
    public void start() {
        running = true;
        log.info("ack after the Cassandra write: no queue");
    }

    @Override
    public void enqueue(TbMsg msg, Callback callback) {
        if (defects.dropSome(java.util.List.of(msg)).isEmpty()) { // DEFECT_DROP_ACKED_PCT
            callback.onSuccess();
            return;
        }
        pending.incrementAndGet();
        ts.saveAsync(msg).whenComplete((v, t) -> {
            pending.decrementAndGet();
            if (t == null) {
                Metrics.STORED.inc();
                callback.onSuccess();
            } else {
                Metrics.ERRORS.inc();
                failures.warn("Cassandra write failed, not acked: " + t);
                callback.onFailure(t);
            }
        });
    }

    @Override
    public long size() {
        return pending.get();
    }

    @Override
    public boolean ready() {
        return running;
    }

    @Override
    public void stop() {
        running = false;
    }
}
