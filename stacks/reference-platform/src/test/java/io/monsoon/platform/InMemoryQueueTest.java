package io.monsoon.platform;

import org.junit.jupiter.api.Test;

import javax.sql.DataSource;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The in-memory queue with a real TsWriter over a stand-in DataSource (no database: the messages carry no
 * entries, so a write is one getConnection() and one close(); a failing DataSource fails the write).
 */
class InMemoryQueueTest {
    /** Counts getConnection() calls (one per batch written); the first {@code failFirst} of them throw. */
    static final class CountingDataSource {
        final AtomicInteger calls = new AtomicInteger();
        final DataSource ds;

        CountingDataSource(int failFirst) {
            Connection conn = (Connection) Proxy.newProxyInstance(getClass().getClassLoader(),
                new Class<?>[]{Connection.class}, (p, m, a) -> m.getName().equals("isClosed") ? Boolean.FALSE : null);
            ds = (DataSource) Proxy.newProxyInstance(getClass().getClassLoader(), new Class<?>[]{DataSource.class},
                (p, m, a) -> {
                    if (!m.getName().equals("getConnection")) throw new UnsupportedOperationException(m.getName());
                    if (calls.incrementAndGet() <= failFirst) throw new SQLException("database down (test)");
                    return conn;
                });
        }
    }

    private static TbMsg msg(int i) {
        return new TbMsg(UUID.randomUUID(), UUID.randomUUID(), "d" + i, "t", i, "{}", Map.of(), List.of());
    }

    /** Waits (not a timed assertion: the bound only stops a hung test) until the counter has moved by n. */
    private static void awaitStored(double before, int n) throws InterruptedException {
        for (int i = 0; i < 3000 && Metrics.STORED.get() - before < n; i++) Thread.sleep(10);
    }

    @Test
    void enqueueAcksAtOnceAndTheQueueIsUnbounded() {
        InMemoryQueue q = new InMemoryQueue(new TsWriter(new CountingDataSource(0).ds, 0), 1, 10);
        AtomicInteger ok = new AtomicInteger();
        List<Throwable> failed = new ArrayList<>();
        TbQueue.Callback cb = new TbQueue.Callback() {
            public void onSuccess() {
                ok.incrementAndGet();
            }

            public void onFailure(Throwable t) {
                failed.add(t);
            }
        };
        for (int i = 0; i < 10_000; i++) q.enqueue(msg(i), cb);
        assertEquals(10_000, ok.get(), "acked before anything is stored");
        assertTrue(failed.isEmpty());
        assertEquals(10_000, q.size(), "no consumer started: every acked message is on the heap");
        assertFalse(q.ready());
        q.stop();
    }

    @Test
    void consumersDrainInBatchesOfAtMostTheBatchSize() throws Exception {
        CountingDataSource db = new CountingDataSource(0);
        InMemoryQueue q = new InMemoryQueue(new TsWriter(db.ds, 0), 1, 100);
        TbQueue.Callback none = new TbQueue.Callback() {
            public void onSuccess() {
            }

            public void onFailure(Throwable t) {
            }
        };
        for (int i = 0; i < 250; i++) q.enqueue(msg(i), none);
        double before = Metrics.STORED.get();
        q.start();
        assertTrue(q.ready());
        awaitStored(before, 250);
        q.stop();
        assertEquals(250.0, Metrics.STORED.get() - before, "every queued message stored once");
        assertEquals(0, q.size());
        assertEquals(3, db.calls.get(), "one consumer, batch size 100, 250 queued: batches of 100, 100, 50");
    }

    @Test
    void aFailedBatchIsRetriedAndCountedAsErrors() throws Exception {
        CountingDataSource db = new CountingDataSource(2);
        InMemoryQueue q = new InMemoryQueue(new TsWriter(db.ds, 0), 1, 50);
        for (int i = 0; i < 20; i++) {
            q.enqueue(msg(i), new TbQueue.Callback() {
                public void onSuccess() {
                }

                public void onFailure(Throwable t) {
                }
            });
        }
        double stored = Metrics.STORED.get(), errors = Metrics.ERRORS.get();
        q.start();
        awaitStored(stored, 20);
        q.stop();
        assertEquals(20.0, Metrics.STORED.get() - stored, "stored once, after two failed attempts");
        assertEquals(40.0, Metrics.ERRORS.get() - errors, "each failed attempt counts the whole batch");
        assertEquals(3, db.calls.get());
    }
}
