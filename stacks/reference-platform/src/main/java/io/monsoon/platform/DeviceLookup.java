package io.monsoon.platform;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.prometheus.metrics.core.datapoints.CounterDataPoint;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * Device lookups on the connection and message path, through a chain of caches, as a Hono protocol adapter does:
 * <pre>
 * near cache (in-process, DEVICE_CACHE_TTL_MS) -> Infinispan (CACHE_TYPE=infinispan, entries live
 * INFINISPAN_LIFESPAN_MS) -> registry (Mongo when REGISTRY_TYPE=mongo, else Postgres)
 * </pre>
 * Two keys: access token -> device id (credentials, at CONNECT and per HTTP request) and device id -> device
 * (at CONNECT and per message). The remote hops are blocking calls (Mongo sync driver, blocking Hot Rod get)
 * run on a pool of REGISTRY_LOOKUP_THREADS threads; each lookup is bounded by REGISTRY_TIMEOUT_MS, after which
 * it fails and the caller refuses the connection / message / request. An Infinispan error (or miss) falls
 * through to the registry; a registry error fails the lookup. Registry results are written back to Infinispan
 * asynchronously. Unknown tokens/devices are not cached.
 */
final class DeviceLookup implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger(DeviceLookup.class);
    private static final RateLimitedLog ERROR_LOG = new RateLimitedLog(log, 5000);

    /** A lookup failed (registry error) or timed out: the caller refuses what it was doing. */
    static final class LookupFailed extends Exception {
        LookupFailed(String message, Throwable cause) {
            super(message, cause);
        }
    }

    private record Near<V>(V value, long expiresAtNanos) {
    }

    /** Which hop a running lookup is on (for attributing a timeout). */
    private static final class Trace {
        volatile String hop = "queue";
    }

    /** Per-message counters, resolved once. */
    private static final CounterDataPoint NEAR_HIT = Metrics.REGISTRY_LOOKUPS.labelValues("near", "hit");
    private static final CounterDataPoint NEAR_MISS = Metrics.REGISTRY_LOOKUPS.labelValues("near", "miss");

    private final DeviceStore store;
    private final InfinispanCache ispn;
    private final long ttlNanos;
    private final long timeoutMs;
    private final ExecutorService pool;
    private final Map<String, Near<UUID>> nearCredentials = new ConcurrentHashMap<>();
    private final Map<UUID, Near<DeviceService.DeviceInfo>> nearDevices = new ConcurrentHashMap<>();

    DeviceLookup(Config cfg, DeviceStore store, InfinispanCache ispn) {
        this.store = store;
        this.ispn = ispn;
        this.ttlNanos = TimeUnit.MILLISECONDS.toNanos(cfg.deviceCacheTtlMs);
        this.timeoutMs = cfg.registryTimeoutMs;
        this.pool = Executors.newFixedThreadPool(cfg.registryLookupThreads, r -> {
            Thread t = new Thread(r, "tb-registry-lookup");
            t.setDaemon(true);
            return t;
        });
        if (ispn != null) Metrics.initRegistry("near", "infinispan", store.name());
        else Metrics.initRegistry("near", store.name());
    }

    // ---------------------------------------------------------------- the transports' entry points

    /** Per-message fast path: the device from the near cache (counted as a near hit/miss), or null. */
    DeviceService.DeviceInfo nearDevice(UUID id) {
        DeviceService.DeviceInfo d = fresh(nearDevices.get(id));
        (d != null ? NEAR_HIT : NEAR_MISS).inc();
        return d;
    }

    /** After a {@link #nearDevice} miss: the device from Infinispan / the registry; completes with null when unknown. */
    CompletableFuture<DeviceService.DeviceInfo> loadDevice(UUID id) {
        return submit(t -> loadDevice(id, t));
    }

    /** Token -> device (credentials, then the device); completes with null when unknown. */
    CompletableFuture<DeviceService.DeviceInfo> byToken(String token) {
        if (token == null || token.isEmpty()) return CompletableFuture.completedFuture(null);
        UUID id = fresh(nearCredentials.get(token));
        if (id != null) {
            NEAR_HIT.inc();
            DeviceService.DeviceInfo d = nearDevice(id);
            if (d != null) return CompletableFuture.completedFuture(d);
            return submit(t -> loadDevice(id, t));
        }
        NEAR_MISS.inc();
        return submit(t -> {
            UUID deviceId = loadCredentials(token, t);
            if (deviceId == null) return null;
            DeviceService.DeviceInfo d = fresh(nearDevices.get(deviceId));
            if (d != null) {
                NEAR_HIT.inc();
                return d;
            }
            NEAR_MISS.inc();
            return loadDevice(deviceId, t);
        });
    }

    /** Blocking {@link #byToken} for the HTTP device API. */
    DeviceService.DeviceInfo byTokenBlocking(String token) throws LookupFailed {
        try {
            return byToken(token).get();
        } catch (ExecutionException e) {
            throw failure(e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new LookupFailed("interrupted", e);
        }
    }

    /** The exception a caller sees, unwrapped to a {@link LookupFailed}. */
    static LookupFailed failure(Throwable e) {
        while (e instanceof CompletionException || e instanceof ExecutionException) {
            if (e.getCause() == null) break;
            e = e.getCause();
        }
        if (e instanceof LookupFailed lf) return lf;
        return new LookupFailed("device lookup failed: " + MongoDeviceStore.firstLine(e), e);
    }

    /** Forgets a device (updated or deleted) in the near caches and in Infinispan. */
    void evict(UUID id, String token) {
        nearDevices.remove(id);
        nearCredentials.values().removeIf(n -> n.value().equals(id));
        if (token != null) nearCredentials.remove(token);
        if (ispn != null) {
            try {
                ispn.removeAsync(InfinispanCache.DEVICES, id.toString());
                if (token != null) ispn.removeAsync(InfinispanCache.CREDENTIALS, token);
            } catch (RuntimeException e) {
                cacheWriteFailed(e);
            }
        }
    }

    @Override
    public void close() {
        pool.shutdownNow();
    }

    // ---------------------------------------------------------------- the chain

    private interface Op<T> {
        T run(Trace t) throws Exception;
    }

    private <T> CompletableFuture<T> submit(Op<T> op) {
        Trace trace = new Trace();
        CompletableFuture<T> f = new CompletableFuture<>();
        try {
            pool.execute(() -> {
                if (f.isDone()) return; // timed out while queued
                try {
                    f.complete(op.run(trace));
                } catch (Throwable e) {
                    f.completeExceptionally(e);
                }
            });
        } catch (RuntimeException e) { // pool shut down
            f.completeExceptionally(e);
        }
        f.orTimeout(timeoutMs, TimeUnit.MILLISECONDS);
        return f.handle((v, e) -> {
            if (e == null) return v;
            if (e instanceof CompletionException && e.getCause() != null) e = e.getCause();
            if (e instanceof TimeoutException) {
                String hop = trace.hop;
                Metrics.REGISTRY_ERRORS.labelValues(hop, "timeout").inc();
                ERROR_LOG.warn("device lookup timed out after " + timeoutMs + " ms (waiting on " + hop + ")");
                throw new CompletionException(new LookupFailed(
                    "device lookup timed out after " + timeoutMs + " ms (waiting on " + hop + ")", e));
            }
            throw new CompletionException(failure(e));
        });
    }

    private UUID loadCredentials(String token, Trace t) throws Exception {
        if (ispn != null) {
            String v = ispnGet(InfinispanCache.CREDENTIALS, token, t);
            if (v != null) {
                UUID id = UUID.fromString(v);
                nearCredentials.put(token, new Near<>(id, expiry()));
                return id;
            }
        }
        UUID id = registry(t, () -> store.deviceIdByToken(token));
        if (id != null) {
            nearCredentials.put(token, new Near<>(id, expiry()));
            if (ispn != null) ispnPut(InfinispanCache.CREDENTIALS, token, id.toString());
        }
        return id;
    }

    private DeviceService.DeviceInfo loadDevice(UUID id, Trace t) throws Exception {
        if (ispn != null) {
            String v = ispnGet(InfinispanCache.DEVICES, id.toString(), t);
            if (v != null) {
                DeviceService.DeviceInfo d = fromJson(v);
                if (d != null) {
                    nearDevices.put(id, new Near<>(d, expiry()));
                    return d;
                }
            }
        }
        DeviceStore.DeviceRow row = registry(t, () -> store.deviceById(id));
        if (row == null) return null;
        DeviceService.DeviceInfo d = new DeviceService.DeviceInfo(row.id(), row.name(), row.type());
        nearDevices.put(id, new Near<>(d, expiry()));
        if (ispn != null) ispnPut(InfinispanCache.DEVICES, id.toString(), toJson(d));
        return d;
    }

    /** One Infinispan get: a miss or an error both mean "ask the registry". */
    private String ispnGet(String cache, String key, Trace t) {
        t.hop = "infinispan";
        long start = System.nanoTime();
        try {
            String v = ispn.get(cache, key);
            Metrics.REGISTRY_LOOKUPS.labelValues("infinispan", v != null ? "hit" : "miss").inc();
            return v;
        } catch (RuntimeException e) {
            Metrics.REGISTRY_ERRORS.labelValues("infinispan", "error").inc();
            ERROR_LOG.warn("Infinispan lookup failed (falling back to the " + store.name() + " registry): "
                + MongoDeviceStore.firstLine(e));
            return null;
        } finally {
            Metrics.REGISTRY_LOOKUP_SECONDS.labelValues("infinispan").observe((System.nanoTime() - start) / 1e9);
        }
    }

    private void ispnPut(String cache, String key, String value) {
        try {
            ispn.putAsync(cache, key, value);
        } catch (RuntimeException e) {
            cacheWriteFailed(e);
        }
    }

    static void cacheWriteFailed(Throwable e) {
        Metrics.REGISTRY_ERRORS.labelValues("infinispan", "error").inc();
        ERROR_LOG.warn("Infinispan write failed: " + MongoDeviceStore.firstLine(e));
    }

    private interface Call<T> {
        T call() throws Exception;
    }

    private <T> T registry(Trace t, Call<T> call) throws Exception {
        String source = store.name();
        t.hop = source;
        long start = System.nanoTime();
        try {
            T v = call.call();
            Metrics.REGISTRY_LOOKUPS.labelValues(source, v != null ? "hit" : "miss").inc();
            return v;
        } catch (Exception e) {
            Metrics.REGISTRY_ERRORS.labelValues(source, "error").inc();
            ERROR_LOG.warn("device registry (" + source + ") lookup failed: " + MongoDeviceStore.firstLine(e));
            throw e;
        } finally {
            Metrics.REGISTRY_LOOKUP_SECONDS.labelValues(source).observe((System.nanoTime() - start) / 1e9);
        }
    }

    // ---------------------------------------------------------------- helpers

    private long expiry() {
        return ttlNanos == 0 ? Long.MAX_VALUE : System.nanoTime() + ttlNanos;
    }

    private static <V> V fresh(Near<V> n) {
        if (n == null) return null;
        if (n.expiresAtNanos() != Long.MAX_VALUE && System.nanoTime() - n.expiresAtNanos() > 0) return null;
        return n.value();
    }

    private static String toJson(DeviceService.DeviceInfo d) {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.put("id", d.id.toString());
        n.put("name", d.name);
        n.put("type", d.type);
        return n.toString();
    }

    private static DeviceService.DeviceInfo fromJson(String s) {
        try {
            JsonNode n = TelemetryParser.MAPPER.readTree(s);
            return new DeviceService.DeviceInfo(UUID.fromString(n.get("id").asText()), n.get("name").asText(),
                n.path("type").asText(null));
        } catch (Exception e) {
            ERROR_LOG.warn("ignoring an unreadable Infinispan device entry: " + s);
            return null;
        }
    }
}
