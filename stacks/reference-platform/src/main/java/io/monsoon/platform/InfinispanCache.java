package io.monsoon.platform;

import org.infinispan.client.hotrod.DataFormat;
import org.infinispan.client.hotrod.RemoteCache;
import org.infinispan.client.hotrod.RemoteCacheManager;
import org.infinispan.client.hotrod.configuration.ClientIntelligence;
import org.infinispan.client.hotrod.configuration.ConfigurationBuilder;
import org.infinispan.commons.configuration.StringConfiguration;
import org.infinispan.commons.dataconversion.MediaType;
import org.infinispan.commons.marshall.UTF8StringMarshaller;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.concurrent.TimeUnit;

/**
 * The shared device cache on an Infinispan server (CACHE_TYPE=infinispan), over Hot Rod, as Eclipse Hono's
 * adapters use one. Two caches, keys and values UTF-8 text (readable through the server's REST API):
 * <pre>
 * credentials:  access token -> device id
 * devices:      device id    -> {"id":..,"name":..,"type":..}
 * </pre>
 * Entries are put with a lifespan (INFINISPAN_LIFESPAN_MS). The caches are used when the server defines them,
 * and created (local, text/plain) otherwise. No authentication; short connect/socket timeouts; no retries.
 */
final class InfinispanCache implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger(InfinispanCache.class);
    static final String DEVICES = "devices";
    static final String CREDENTIALS = "credentials";
    private static final DataFormat TEXT = DataFormat.builder()
        .keyType(MediaType.TEXT_PLAIN).valueType(MediaType.TEXT_PLAIN).build();

    private final Config cfg;
    private final RemoteCacheManager manager;
    private volatile RemoteCache<String, String> devices;
    private volatile RemoteCache<String, String> credentials;

    InfinispanCache(Config cfg) {
        this.cfg = cfg;
        // half the lookup budget: a hung server still leaves time to fall through to the registry
        int socketTimeout = (int) Math.min(Integer.MAX_VALUE, Math.max(cfg.registryTimeoutMs / 2, 250));
        ConfigurationBuilder b = new ConfigurationBuilder();
        b.addServer().host(cfg.infinispanHost).port(cfg.infinispanPort);
        b.connectionTimeout(2000)
            .socketTimeout(socketTimeout)
            .maxRetries(0) // a failed operation falls through to the registry instead of being retried
            .clientIntelligence(ClientIntelligence.BASIC) // one server, no topology
            .marshaller(new UTF8StringMarshaller());
        b.security().authentication().disable();
        b.statistics().disable();
        manager = new RemoteCacheManager(b.build(), false);
    }

    String address() {
        return cfg.infinispanHost + ":" + cfg.infinispanPort;
    }

    /** Bounded wait until the server answers and both caches exist; throws with a clear message otherwise. */
    void start(int timeoutSec) {
        long deadline = System.nanoTime() + timeoutSec * 1_000_000_000L;
        int attempt = 0;
        while (true) {
            attempt++;
            try {
                if (!manager.isStarted()) manager.start();
                devices = cache(DEVICES);
                credentials = cache(CREDENTIALS);
                devices.get("monsoon-ping"); // one round trip: the server answers
                if (attempt > 1) log.info("Infinispan reachable after {} attempts", attempt);
                log.info("Infinispan cache ready at {} (caches {}, {}; lifespan {} ms)", address(), DEVICES, CREDENTIALS,
                    cfg.infinispanLifespanMs);
                return;
            } catch (RuntimeException e) {
                if (System.nanoTime() > deadline) {
                    close();
                    throw new IllegalStateException("cannot reach Infinispan (Hot Rod) at " + address() + " within "
                        + timeoutSec + " s: " + MongoDeviceStore.firstLine(e), e);
                }
                if (attempt == 1 || attempt % 5 == 0) {
                    log.warn("Infinispan not reachable at {} yet ({}); retrying", address(), MongoDeviceStore.firstLine(e));
                }
                Db.sleep(1000);
            }
        }
    }

    private RemoteCache<String, String> cache(String name) {
        RemoteCache<String, String> c = manager.getCache(name);
        if (c == null) {
            log.info("Infinispan cache '{}' not defined on the server: creating it (local, text/plain)", name);
            String xml = "<local-cache name=\"" + name + "\" statistics=\"true\">"
                + "<encoding media-type=\"text/plain; charset=UTF-8\"/></local-cache>";
            c = manager.administration().getOrCreateCache(name, new StringConfiguration(xml));
        }
        return c.withDataFormat(TEXT);
    }

    /** Blocking get (a Hot Rod round trip); throws on transport errors and timeouts. */
    String get(String cache, String key) {
        return pick(cache).get(key);
    }

    /** Fire-and-forget put with the configured lifespan; failures are counted and logged (rate-limited). */
    void putAsync(String cache, String key, String value) {
        pick(cache).putAsync(key, value, cfg.infinispanLifespanMs, TimeUnit.MILLISECONDS)
            .whenComplete((v, e) -> {
                if (e != null) DeviceLookup.cacheWriteFailed(e);
            });
    }

    void removeAsync(String cache, String key) {
        pick(cache).removeAsync(key).whenComplete((v, e) -> {
            if (e != null) DeviceLookup.cacheWriteFailed(e);
        });
    }

    private RemoteCache<String, String> pick(String cache) {
        return DEVICES.equals(cache) ? devices : credentials;
    }

    @Override
    public void close() {
        try {
            manager.stop();
        } catch (RuntimeException e) {
            log.debug("stopping the Hot Rod client: {}", e.toString());
        }
    }
}
