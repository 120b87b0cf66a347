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
        if (consumerThreads < 1) throw new IllegalArgumentException("TB_CONSUMER_THREADS must be >= 1");
        if (consumerBatchSize < 1) throw new IllegalArgumentException("TB_CONSUMER_BATCH_SIZE must be >= 1");
        if (kafkaPartitions < 1) throw new IllegalArgumentException("TB_KAFKA_PARTITIONS must be >= 1");
    }

    boolean kafka() {
        return queueType.equals("kafka");
    }

    private static String get(Map<String, String> env, String name, String def) {
        String v = env.get(name);
        return v == null || v.isBlank() ? def : v;
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
