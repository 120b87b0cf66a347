package io.monsoon.platform;

import com.zaxxer.hikari.HikariDataSource;
import org.slf4j.Logger;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;

/**
 * monsoon reference platform: a small ThingsBoard-like ingestion service.
 * MQTT / HTTP device API -> queue (in-memory or Kafka) -> rule-engine consumers -> Postgres.
 */
public final class Main {
    private static Logger log;
    private static volatile boolean ready;

    private Main() {
    }

    public static void main(String[] args) {
        setIfAbsent("org.slf4j.simpleLogger.logFile", "System.out");
        setIfAbsent("org.slf4j.simpleLogger.showDateTime", "true");
        setIfAbsent("org.slf4j.simpleLogger.dateTimeFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSZ");
        setIfAbsent("org.slf4j.simpleLogger.defaultLogLevel", "info");
        setIfAbsent("org.slf4j.simpleLogger.log.org.apache.kafka", "warn");
        setIfAbsent("org.slf4j.simpleLogger.log.com.zaxxer.hikari", "warn");
        setIfAbsent("org.slf4j.simpleLogger.log.io.netty", "warn");
        setIfAbsent("org.slf4j.simpleLogger.log.org.mongodb.driver", "warn");
        // The Hot Rod client logs every failed operation at ERROR with a stack trace (one per lookup during an
        // outage): off; DeviceLookup reports cache failures itself, rate-limited.
        setIfAbsent("org.slf4j.simpleLogger.log.org.infinispan", "off");
        setIfAbsent("org.jboss.logging.provider", "slf4j"); // Infinispan's client logs through jboss-logging
        log = org.slf4j.LoggerFactory.getLogger(Main.class);

        // Without -XX:+ExitOnOutOfMemoryError an OOM would only kill one thread: die like the launcher would.
        Thread.setDefaultUncaughtExceptionHandler((t, e) -> {
            if (e instanceof OutOfMemoryError) {
                System.err.println("Terminating due to java.lang.OutOfMemoryError: " + e.getMessage());
                Runtime.getRuntime().halt(3);
            }
            log.error("uncaught exception in thread {}", t.getName(), e);
        });

        Config cfg;
        try {
            cfg = new Config(System.getenv());
        } catch (IllegalArgumentException e) {
            System.err.println("reference-platform: configuration error: " + e.getMessage());
            System.exit(2);
            return;
        }
        Runtime rt = Runtime.getRuntime();
        log.info("reference-platform starting: queue={} consumers={} batch={} commitDelay={}ms maxHeap={}MB"
                + " registry={} cache={} nearTtl={}ms lookupTimeout={}ms",
            cfg.queueType, cfg.consumerThreads, cfg.consumerBatchSize, cfg.storageCommitDelayMs,
            rt.maxMemory() / (1024 * 1024), cfg.registryType, cfg.cacheType, cfg.deviceCacheTtlMs, cfg.registryTimeoutMs);
        if (!cfg.defects.active().isEmpty()) {
            log.warn("SEEDED DEFECTS ON (this platform is deliberately broken): {}", String.join(", ", cfg.defects.active()));
        }

        JwtService jwt = new JwtService(cfg);
        HttpApi http = new HttpApi(cfg, jwt, () -> ready);
        HikariDataSource ds = null;
        TbQueue queue = null;
        MqttTransport mqtt = null;
        List<AutoCloseable> registry = new ArrayList<>(); // closed last: lookups, Hot Rod client, Mongo client
        try {
            http.start(); // /health answers 503 until everything below is up
            Db.awaitServer(cfg);
            ds = Db.pool(cfg, cfg.consumerThreads + 8);
            Db.createSchema(ds, cfg.defects);
            log.info("database schema ready at {}", cfg.dbUrl);
            SqlDeviceStore sql = new SqlDeviceStore(ds);
            DeviceStore store = sql;
            if (cfg.mongo()) {
                MongoDeviceStore mongo = new MongoDeviceStore(cfg, sql, jwt.tenantId);
                registry.add(0, mongo);
                mongo.start(cfg.startupTimeoutSec);
                store = mongo;
            }
            InfinispanCache ispn = null;
            if (cfg.infinispan()) {
                ispn = new InfinispanCache(cfg);
                registry.add(0, ispn);
                ispn.start(cfg.startupTimeoutSec);
            }
            DeviceLookup lookup = new DeviceLookup(cfg, store, ispn);
            registry.add(0, lookup);
            DeviceService devices = new DeviceService(ds, jwt.tenantId, store, lookup);
            devices.ensureDefaultProfile();

            TsWriter writer = new TsWriter(ds, cfg.storageCommitDelayMs, cfg.defects);
            CassandraTs cassandra = null;
            if (cfg.cassandra()) {
                cassandra = new CassandraTs(cfg);
                registry.add(cassandra); // closed after the queue has stopped
                cassandra.start(cfg.startupTimeoutSec);
                writer.withCassandra(cassandra);
            }
            if (cfg.ackAfterTsWrite) {
                queue = new CassandraAckQueue(cassandra, cfg.defects);
                final TbQueue q = queue;
                Metrics.init(() -> q.size(), null);
            } else if (cfg.kafka()) {
                KafkaQueue kq = new KafkaQueue(cfg, writer);
                queue = kq;
                final TbQueue q = kq;
                Metrics.init(() -> q.size(), kq::consumerLag);
            } else {
                queue = new InMemoryQueue(writer, cfg.consumerThreads, cfg.consumerBatchSize);
                final TbQueue q = queue;
                Metrics.init(() -> q.size(), null);
            }
            queue.start();
            mqtt = new MqttTransport(cfg, devices, queue);
            mqtt.start();
            http.attach(devices, queue);
            final TbQueue q = queue;
            final MqttTransport m = mqtt;
            ready = true;
            Thread readyWatch = new Thread(() -> {
                while (true) { // /health follows the live state of the MQTT listener and the queue
                    ready = m.listening() && q.ready();
                    Db.sleep(500);
                }
            }, "tb-health");
            readyWatch.setDaemon(true);
            readyWatch.start();
        } catch (Throwable e) {
            String msg = e.getMessage() == null ? e.toString() : e.getMessage();
            log.error("reference-platform failed to start: {}", msg);
            System.err.println("reference-platform: startup failed: " + msg);
            stopQuietly(mqtt, queue, http, ds, registry);
            System.exit(1);
            return;
        }
        log.info("reference-platform started: mqtt={}:{} http={}:{} queue={} registry={} cache={} pid={}",
            cfg.mqttHost, cfg.mqttPort, cfg.httpHost, cfg.httpPort, cfg.queueType, cfg.registryType, cfg.cacheType,
            ProcessHandle.current().pid());

        CountDownLatch stopped = new CountDownLatch(1);
        final MqttTransport fm = mqtt;
        final TbQueue fq = queue;
        final HikariDataSource fds = ds;
        rt.addShutdownHook(new Thread(() -> {
            log.info("reference-platform stopping");
            ready = false;
            stopQuietly(fm, fq, http, fds, registry);
            stopped.countDown();
        }, "tb-shutdown"));
        try {
            stopped.await();
        } catch (InterruptedException ignored) {
            Thread.currentThread().interrupt();
        }
    }

    private static void stopQuietly(MqttTransport mqtt, TbQueue queue, HttpApi http, HikariDataSource ds,
                                    List<AutoCloseable> registry) {
        try {
            if (mqtt != null) mqtt.stop();
        } catch (Throwable ignored) {
            // best effort
        }
        try {
            if (queue != null) queue.stop();
        } catch (Throwable ignored) {
            // best effort
        }
        try {
            http.stop();
        } catch (Throwable ignored) {
            // best effort
        }
        for (AutoCloseable c : registry) {
            try {
                c.close();
            } catch (Throwable ignored) {
                // best effort
            }
        }
        try {
            if (ds != null) ds.close();
        } catch (Throwable ignored) {
            // best effort
        }
    }

    private static void setIfAbsent(String key, String value) {
        if (System.getProperty(key) == null) System.setProperty(key, value);
    }
}
