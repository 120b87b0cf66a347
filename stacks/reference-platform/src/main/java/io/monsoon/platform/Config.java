package io.monsoon.platform;

import java.util.Map;

/** Settings read once from the environment (names and defaults are part of the monsoon contract). */
final class Config {
    final String queueType;
    final String mqttHost;
    final int mqttPort;
    final String httpHost;
    final int httpPort;
    final String dbUrl;
    final String dbUser;
    final String dbPassword;
    final String kafkaServers;
    final String kafkaTopic;
    final int kafkaPartitions;
    final String kafkaGroup;
    final String kafkaGroupInstanceId;
    final int consumerThreads;
    final int consumerBatchSize;
    final String adminUsername;
    final String adminPassword;
    final String jwtSigningKey;
    final long jwtExpirationSec;
    final long jwtRefreshExpirationSec;
    final int startupTimeoutSec;
    final int storageCommitDelayMs;
    /** Device registry: {@code sql} (Postgres tables, the default) or {@code mongo} (MongoDB / FerretDB). */
    final String registryType;
    /** Device cache behind the near cache: {@code local} (none) or {@code infinispan} (Hot Rod). */
    final String cacheType;
    final String mongoUrl;
    final String infinispanHost;
    final int infinispanPort;
    /** TTL of the in-process near cache (ms); 0 = entries never expire (evicted only on update/delete). */
    final long deviceCacheTtlMs;
    /** Lifespan of the entries this process puts into Infinispan (ms). */
    final long infinispanLifespanMs;
    /** A device lookup not answered within this many ms fails: the connection/message/request is refused. */
    final long registryTimeoutMs;
    /** Threads running blocking registry/cache lookups (one lookup per device channel at a time). */
    final int registryLookupThreads;
    /** DATABASE_TS_TYPE: sql (time series in Postgres) or cassandra (time series in Cassandra, latest in Postgres). */
    final String tsType;
    final java.util.List<java.net.InetSocketAddress> cassandraContactPoints;
    final String cassandraKeyspace;
    final String cassandraLocalDc;
    /** Requests in flight per connection before a caller waits for the pool (driver 4.x default: 1024). */
    final int cassandraMaxRequestsPerConnection;
    final int cassandraConnections;
    /** How long a caller waits for a free connection before the write fails (driver 3.x's poolTimeoutMillis). */
    final long cassandraPoolTimeoutMs;
    final long cassandraRequestTimeoutMs;
    final String cassandraWriteConsistency;
    /** TB_ACK_AFTER_TS_WRITE: ack (PUBACK) only after the Cassandra write, no queue (NDU's shape). */
    final boolean ackAfterTsWrite;
    /** Seeded defects ({@code DEFECT_*}, all off by default): see {@link Defects}. */
    final Defects defects;

    Config(Map<String, String> env) {
        queueType = get(env, "TB_QUEUE_TYPE", "in-memory").trim().toLowerCase();
        if (!queueType.equals("in-memory") && !queueType.equals("kafka")) {
            throw new IllegalArgumentException("TB_QUEUE_TYPE must be 'in-memory' or 'kafka', got '" + queueType + "'");
        }
        mqttHost = get(env, "MQTT_BIND_ADDRESS", "127.0.0.1");
        mqttPort = getInt(env, "MQTT_BIND_PORT", 1883);
        httpHost = get(env, "HTTP_BIND_ADDRESS", "127.0.0.1");
        httpPort = getInt(env, "HTTP_BIND_PORT", 8080);
        dbUrl = get(env, "DATABASE_URL", "jdbc:postgresql://127.0.0.1:5432/postgres");
        dbUser = get(env, "DATABASE_USERNAME", "postgres");
        dbPassword = env.getOrDefault("DATABASE_PASSWORD", "");
        kafkaServers = get(env, "TB_KAFKA_SERVERS", "127.0.0.1:9092");
        kafkaTopic = get(env, "TB_KAFKA_TOPIC", "tb_rule_engine");
        kafkaPartitions = getInt(env, "TB_KAFKA_PARTITIONS", 2);
        kafkaGroup = get(env, "TB_KAFKA_GROUP", "tb-rule-engine");
        String instance = env.get("TB_KAFKA_GROUP_INSTANCE_ID");
        kafkaGroupInstanceId = instance == null || instance.isBlank() ? null : instance.trim();
        consumerThreads = getInt(env, "TB_CONSUMER_THREADS", 1);
        consumerBatchSize = getInt(env, "TB_CONSUMER_BATCH_SIZE", 200);
        adminUsername = get(env, "TB_ADMIN_USERNAME", "tenant@thingsboard.org");
        adminPassword = get(env, "TB_ADMIN_PASSWORD", "tenant");
        jwtSigningKey = get(env, "JWT_TOKEN_SIGNING_KEY", "thingsboardDefaultSigningKey");
        jwtExpirationSec = getInt(env, "JWT_TOKEN_EXPIRATION_TIME", 9000);
        jwtRefreshExpirationSec = getInt(env, "JWT_REFRESH_TOKEN_EXPIRATION_TIME", 604800);
        startupTimeoutSec = getInt(env, "TB_STARTUP_TIMEOUT", 30);
        storageCommitDelayMs = getInt(env, "TB_STORAGE_COMMIT_DELAY_MS", 50);
        registryType = get(env, "REGISTRY_TYPE", "sql").trim().toLowerCase();
        if (!registryType.equals("sql") && !registryType.equals("mongo")) {
            throw new IllegalArgumentException("REGISTRY_TYPE must be 'sql' or 'mongo', got '" + registryType + "'");
        }
        cacheType = get(env, "CACHE_TYPE", "local").trim().toLowerCase();
        if (!cacheType.equals("local") && !cacheType.equals("infinispan")) {
            throw new IllegalArgumentException("CACHE_TYPE must be 'local' or 'infinispan', got '" + cacheType + "'");
        }
        mongoUrl = get(env, "MONGO_URL", "mongodb://127.0.0.1:27017/monsoon");
        if (!mongoUrl.startsWith("mongodb://") && !mongoUrl.startsWith("mongodb+srv://")) {
            throw new IllegalArgumentException("MONGO_URL must be a mongodb:// connection string, got '" + mongoUrl + "'");
        }
        String ispn = get(env, "INFINISPAN_SERVER", "127.0.0.1:11222").trim();
        int colon = ispn.lastIndexOf(':');
        try {
            infinispanHost = colon < 0 ? ispn : ispn.substring(0, colon);
            infinispanPort = colon < 0 ? 11222 : Integer.parseInt(ispn.substring(colon + 1));
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("INFINISPAN_SERVER must be host:port, got '" + ispn + "'");
        }
        // Without a remote registry/cache the near cache keeps today's behaviour: no expiry.
        boolean remote = mongo() || infinispan();
        deviceCacheTtlMs = getLong(env, "DEVICE_CACHE_TTL_MS", remote ? 1000 : 0);
        infinispanLifespanMs = getLong(env, "INFINISPAN_LIFESPAN_MS", 10000);
        registryTimeoutMs = getLong(env, "REGISTRY_TIMEOUT_MS", 3000);
        registryLookupThreads = getInt(env, "REGISTRY_LOOKUP_THREADS", 64);
        if (deviceCacheTtlMs < 0) throw new IllegalArgumentException("DEVICE_CACHE_TTL_MS must be >= 0");
        if (infinispanLifespanMs < 1) throw new IllegalArgumentException("INFINISPAN_LIFESPAN_MS must be >= 1");
        if (registryTimeoutMs < 1) throw new IllegalArgumentException("REGISTRY_TIMEOUT_MS must be >= 1");
        if (registryLookupThreads < 1) throw new IllegalArgumentException("REGISTRY_LOOKUP_THREADS must be >= 1");
        if (consumerThreads < 1) throw new IllegalArgumentException("TB_CONSUMER_THREADS must be >= 1");
        if (consumerBatchSize < 1) throw new IllegalArgumentException("TB_CONSUMER_BATCH_SIZE must be >= 1");
        if (kafkaPartitions < 1) throw new IllegalArgumentException("TB_KAFKA_PARTITIONS must be >= 1");
        tsType = get(env, "DATABASE_TS_TYPE", "sql").trim().toLowerCase();
        if (!tsType.equals("sql") && !tsType.equals("cassandra")) {
            throw new IllegalArgumentException("DATABASE_TS_TYPE must be sql or cassandra, got '" + tsType + "'");
        }
        java.util.List<java.net.InetSocketAddress> cps = new java.util.ArrayList<>();
        for (String hp : get(env, "CASSANDRA_URL", "127.0.0.1:9042").split(",")) {
            String t = hp.trim();
            int cut = t.lastIndexOf(':');
            cps.add(cut < 0 ? new java.net.InetSocketAddress(t, 9042)
                : new java.net.InetSocketAddress(t.substring(0, cut), Integer.parseInt(t.substring(cut + 1))));
        }
        cassandraContactPoints = java.util.List.copyOf(cps);
        cassandraKeyspace = get(env, "CASSANDRA_KEYSPACE_NAME", "thingsboard");
        cassandraLocalDc = get(env, "CASSANDRA_LOCAL_DATACENTER", "datacenter1");
        // DEFECT_CASSANDRA_MAX_REQUESTS_PER_CONNECTION (seeded defect g, connection-pool starvation) overrides it
        cassandraMaxRequestsPerConnection = getInt(env, "DEFECT_CASSANDRA_MAX_REQUESTS_PER_CONNECTION",
            getInt(env, "CASSANDRA_MAX_REQUESTS_PER_CONNECTION", 1024));
        cassandraConnections = getInt(env, "CASSANDRA_CONNECTIONS", 1);
        cassandraPoolTimeoutMs = getLong(env, "CASSANDRA_POOL_TIMEOUT_MS", 5000);
        cassandraRequestTimeoutMs = getLong(env, "CASSANDRA_REQUEST_TIMEOUT_MS", 10000);
        cassandraWriteConsistency = get(env, "CASSANDRA_WRITE_CONSISTENCY_LEVEL", "ONE");
        ackAfterTsWrite = Boolean.parseBoolean(get(env, "TB_ACK_AFTER_TS_WRITE", "false").trim());
        if (cassandraMaxRequestsPerConnection < 1 || cassandraMaxRequestsPerConnection > 32000) {
            throw new IllegalArgumentException("CASSANDRA_MAX_REQUESTS_PER_CONNECTION must be 1..32000");
        }
        if (cassandraConnections < 1) throw new IllegalArgumentException("CASSANDRA_CONNECTIONS must be >= 1");
        if (ackAfterTsWrite && !cassandra()) {
            throw new IllegalArgumentException("TB_ACK_AFTER_TS_WRITE needs DATABASE_TS_TYPE=cassandra");
        }
        defects = Defects.fromEnv(env);
        if ((defects.stallAfterBrokerRestart || defects.commitBeforeWrite) && !kafka()) {
            throw new IllegalArgumentException("DEFECT_STALL_AFTER_BROKER_RESTART and DEFECT_COMMIT_BEFORE_WRITE need"
                + " TB_QUEUE_TYPE=kafka");
        }
    }

    boolean kafka() {
        return queueType.equals("kafka");
    }

    boolean cassandra() {
        return tsType.equals("cassandra");
    }

    boolean mongo() {
        return registryType.equals("mongo");
    }

    boolean infinispan() {
        return cacheType.equals("infinispan");
    }

    private static String get(Map<String, String> env, String name, String def) {
        String v = env.get(name);
        return v == null || v.isBlank() ? def : v;
    }

    private static long getLong(Map<String, String> env, String name, long def) {
        String v = env.get(name);
        if (v == null || v.isBlank()) return def;
        try {
            return Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be an integer, got '" + v + "'");
        }
    }

    private static int getInt(Map<String, String> env, String name, int def) {
        String v = env.get(name);
        if (v == null || v.isBlank()) return def;
        try {
            return Integer.parseInt(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(name + " must be an integer, got '" + v + "'");
        }
    }
}
