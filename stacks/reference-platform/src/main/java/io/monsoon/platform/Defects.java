package io.monsoon.platform;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Seeded defects: bugs no clean deployment has, switched on by {@code DEFECT_*} environment variables (all off by
 * default), so that monsoon can prove its checks catch them ({@code make defects}). Each one is a realistic bug:
 * <ul>
 *   <li>{@code DEFECT_DROP_ACKED_PCT=p} (a): the storage writer silently skips p % of the messages of every batch
 *       (already acked to the device) - no error, no metric.</li>
 *   <li>{@code DEFECT_DUPLICATE_ON_REDELIVERY=true} (b): {@code ts_kv} has no primary key and rows are plain
 *       {@code INSERT}s, so a batch the queue delivers again (Kafka: written but not committed before a rebalance
 *       or restart) is stored twice.</li>
 *   <li>{@code DEFECT_LEAK_BYTES_PER_MSG=n} (c): an "audit cache" keeps n bytes per stored message forever.</li>
 *   <li>{@code DEFECT_STALL_AFTER_BROKER_RESTART=true} (d): when a consuming Kafka consumer loses a broker
 *       connection, it pauses its partitions "until the broker is back" and never resumes them.</li>
 *   <li>{@code DEFECT_COMMIT_BEFORE_WRITE=true} (e): Kafka offsets are committed before the batch is written, so a
 *       crash between the two loses the batch.</li>
 *   <li>{@code DEFECT_LEAK_THREAD_PER_RECONNECT=true} (f): every accepted MQTT session starts a "session timer"
 *       thread that is never shut down when the session closes: one thread leaks per device (re)connect.</li>
 * </ul>
 */
final class Defects {
    private static final Logger log = LoggerFactory.getLogger(Defects.class);

    final double dropAckedPct;
    final boolean duplicateOnRedelivery;
    final int leakBytesPerMsg;
    final boolean stallAfterBrokerRestart;
    final boolean commitBeforeWrite;
    final boolean leakThreadPerReconnect;

    /** (c) what the leaky audit cache holds: never evicted. */
    private static final ConcurrentLinkedQueue<byte[]> AUDIT = new ConcurrentLinkedQueue<>();
    private static final AtomicLong LEAKED_BYTES = new AtomicLong();
    /** (f) the session timers that were never shut down (kept only so the leak is visible in a heap dump). */
    private static final ConcurrentLinkedQueue<ScheduledExecutorService> TIMERS = new ConcurrentLinkedQueue<>();
    private static final AtomicLong TIMER_SEQ = new AtomicLong();

    Defects(double dropAckedPct, boolean duplicateOnRedelivery, int leakBytesPerMsg, boolean stallAfterBrokerRestart,
            boolean commitBeforeWrite, boolean leakThreadPerReconnect) {
        if (dropAckedPct < 0 || dropAckedPct > 100) {
            throw new IllegalArgumentException("DEFECT_DROP_ACKED_PCT must be between 0 and 100, got " + dropAckedPct);
        }
        if (leakBytesPerMsg < 0) throw new IllegalArgumentException("DEFECT_LEAK_BYTES_PER_MSG must be >= 0");
        this.dropAckedPct = dropAckedPct;
        this.duplicateOnRedelivery = duplicateOnRedelivery;
        this.leakBytesPerMsg = leakBytesPerMsg;
        this.stallAfterBrokerRestart = stallAfterBrokerRestart;
        this.commitBeforeWrite = commitBeforeWrite;
        this.leakThreadPerReconnect = leakThreadPerReconnect;
    }

    /** No defect: the platform as it should be. */
    static final Defects NONE = new Defects(0, false, 0, false, false, false);

    static Defects fromEnv(Map<String, String> env) {
        return new Defects(
            dbl(env, "DEFECT_DROP_ACKED_PCT"),
            bool(env, "DEFECT_DUPLICATE_ON_REDELIVERY"),
            (int) dbl(env, "DEFECT_LEAK_BYTES_PER_MSG"),
            bool(env, "DEFECT_STALL_AFTER_BROKER_RESTART"),
            bool(env, "DEFECT_COMMIT_BEFORE_WRITE"),
            bool(env, "DEFECT_LEAK_THREAD_PER_RECONNECT"));
    }

    /** The defects switched on, e.g. {@code [DEFECT_DROP_ACKED_PCT=0.1]}; empty for a clean platform. */
    List<String> active() {
        List<String> out = new ArrayList<>();
        if (dropAckedPct > 0) out.add("DEFECT_DROP_ACKED_PCT=" + dropAckedPct);
        if (duplicateOnRedelivery) out.add("DEFECT_DUPLICATE_ON_REDELIVERY");
        if (leakBytesPerMsg > 0) out.add("DEFECT_LEAK_BYTES_PER_MSG=" + leakBytesPerMsg);
        if (stallAfterBrokerRestart) out.add("DEFECT_STALL_AFTER_BROKER_RESTART");
        if (commitBeforeWrite) out.add("DEFECT_COMMIT_BEFORE_WRITE");
        if (leakThreadPerReconnect) out.add("DEFECT_LEAK_THREAD_PER_RECONNECT");
        return out;
    }

    // ------------------------------------------------------------------ (a) drop acked messages

    /** The batch without the messages the defect drops (the same list when (a) is off). */
    List<TbMsg> dropSome(List<TbMsg> batch) {
        if (dropAckedPct <= 0) return batch;
        ThreadLocalRandom rnd = ThreadLocalRandom.current();
        List<TbMsg> kept = new ArrayList<>(batch.size());
        for (TbMsg m : batch) {
            if (rnd.nextDouble() * 100.0 >= dropAckedPct) kept.add(m);
        }
        return kept;
    }

    // ------------------------------------------------------------------ (c) memory leak per message

    /** Remembers {@code leakBytesPerMsg} bytes for each of {@code messages} stored messages, forever. */
    void retain(int messages) {
        if (leakBytesPerMsg <= 0 || messages <= 0) return;
        for (int i = 0; i < messages; i++) AUDIT.add(new byte[leakBytesPerMsg]);
        LEAKED_BYTES.addAndGet((long) leakBytesPerMsg * messages);
    }

    static long leakedBytes() {
        return LEAKED_BYTES.get();
    }

    // ------------------------------------------------------------------ (f) thread leak per reconnect

    /**
     * Starts the per-session timer of an accepted MQTT session. The bug: nothing ever shuts it down, so its
     * thread outlives the session.
     */
    void sessionStarted(String device) {
        if (!leakThreadPerReconnect) return;
        long n = TIMER_SEQ.incrementAndGet();
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "tb-session-timer-" + n);
            t.setDaemon(true);
            return t;
        });
        timer.scheduleWithFixedDelay(() -> { }, 1, 1, TimeUnit.SECONDS); // "session housekeeping"
        TIMERS.add(timer);
        if (n % 50 == 0) log.info("DEFECT_LEAK_THREAD_PER_RECONNECT: {} session timer thread(s) started, none stopped ({})",
            n, device);
    }

    // ------------------------------------------------------------------ env

    private static double dbl(Map<String, String> env, String name) {
        String v = env.get(name);
        if (v == null || v.isBlank()) return 0;
        try {
            return Double.parseDouble(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be a number, got '" + v + "'");
        }
    }

    private static boolean bool(Map<String, String> env, String name) {
        String v = env.get(name);
        if (v == null || v.isBlank()) return false;
        String s = v.trim().toLowerCase();
        if (s.equals("true") || s.equals("1") || s.equals("yes") || s.equals("on")) return true;
        if (s.equals("false") || s.equals("0") || s.equals("no") || s.equals("off")) return false;
        throw new IllegalArgumentException(name + " must be true or false, got '" + v + "'");
    }
}
