package io.monsoon.platform;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * TB_QUEUE_TYPE=in-memory: an UNBOUNDED LinkedBlockingQueue of TbMsg, drained in batches by
 * TB_CONSUMER_THREADS consumers. Acked messages live only on the heap: a flood faster than storage
 * grows the queue until the JVM runs out of memory, and whatever was queued is lost.
 */
final class InMemoryQueue implements TbQueue {
    private static final Logger log = LoggerFactory.getLogger(InMemoryQueue.class);

    private final LinkedBlockingQueue<TbMsg> queue = new LinkedBlockingQueue<>();
    private final TsWriter writer;
    private final int threads;
    private final int batchSize;
    private final List<Thread> consumers = new ArrayList<>();
    private volatile boolean running = true;

    InMemoryQueue(TsWriter writer, int threads, int batchSize) {
        this.writer = writer;
        this.threads = threads;
        this.batchSize = batchSize;
    }

    @Override
    public void start() {
        for (int i = 0; i < threads; i++) {
            Thread t = new Thread(this::consume, "tb-rule-engine-consumer-" + i);
            t.setDaemon(true);
            t.start();
            consumers.add(t);
        }
        log.info("in-memory queue started: {} consumer thread(s), batch size {}", threads, batchSize);
    }

    @Override
    public void enqueue(TbMsg msg, Callback callback) {
        queue.add(msg);
        callback.onSuccess();
    }

    private void consume() {
        List<TbMsg> batch = new ArrayList<>(batchSize);
        while (running) {
            try {
                TbMsg first = queue.poll(500, TimeUnit.MILLISECONDS);
                if (first == null) continue;
                batch.add(first);
                queue.drainTo(batch, batchSize - 1);
                long backoff = 100;
                while (running) {
                    try {
                        writer.write(batch);
                        Metrics.STORED.inc(batch.size());
                        break;
                    } catch (Exception e) {
                        Metrics.ERRORS.inc(batch.size());
                        log.warn("storing a batch of {} failed ({}); retrying in {} ms", batch.size(), e.getMessage(), backoff);
                        Thread.sleep(backoff);
                        backoff = Math.min(backoff * 2, 5000);
                    }
                }
                batch.clear();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    @Override
    public long size() {
        return queue.size();
    }

    @Override
    public boolean ready() {
        return !consumers.isEmpty();
    }

    @Override
    public void stop() {
        running = false;
        for (Thread t : consumers) {
            try {
                t.join(2000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if (!queue.isEmpty()) log.warn("stopping with {} acked message(s) still in the in-memory queue: they are lost", queue.size());
    }
}
