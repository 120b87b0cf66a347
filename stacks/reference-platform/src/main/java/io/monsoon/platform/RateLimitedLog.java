package io.monsoon.platform;

import org.slf4j.Logger;

import java.util.concurrent.atomic.AtomicLong;

/** At most one WARN line per interval; the lines suppressed meanwhile are counted in the next one. */
final class RateLimitedLog {
    private final Logger log;
    private final long intervalMs;
    private final AtomicLong next = new AtomicLong();
    private final AtomicLong suppressed = new AtomicLong();

    RateLimitedLog(Logger log, long intervalMs) {
        this.log = log;
        this.intervalMs = intervalMs;
    }

    void warn(String message) {
        long now = System.currentTimeMillis();
        long n = next.get();
        if (now >= n && next.compareAndSet(n, now + intervalMs)) {
            long s = suppressed.getAndSet(0);
            log.warn(s == 0 ? message : message + " (" + s + " similar message(s) suppressed)");
        } else {
            suppressed.incrementAndGet();
        }
    }
}
