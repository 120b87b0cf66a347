package io.monsoon.platform;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

/** Postgres access: a bounded wait for the server at startup, a connection pool, and the schema. */
final class Db {
    private static final Logger log = LoggerFactory.getLogger(Db.class);

    static final String[] SCHEMA = {
        "CREATE TABLE IF NOT EXISTS device_profile ("
            + " id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, name varchar(255) UNIQUE,"
            + " type varchar(255), transport_type varchar(255), is_default boolean, description varchar)",
        "CREATE TABLE IF NOT EXISTS device ("
            + " id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, name varchar(255) UNIQUE,"
            + " type varchar(255), label varchar(255), device_profile_id uuid)",
        "CREATE TABLE IF NOT EXISTS device_credentials ("
            + " id uuid NOT NULL PRIMARY KEY, created_time bigint NOT NULL, device_id uuid UNIQUE,"
            + " credentials_type varchar(255), credentials_id varchar UNIQUE)",
        "CREATE TABLE IF NOT EXISTS key_dictionary ("
            + " key varchar(255) NOT NULL PRIMARY KEY, key_id serial UNIQUE)",
        "CREATE TABLE IF NOT EXISTS ts_kv ("
            + " entity_id uuid NOT NULL, key int NOT NULL, ts bigint NOT NULL, bool_v boolean, str_v varchar,"
            + " long_v bigint, dbl_v double precision, json_v json,"
            + " CONSTRAINT ts_kv_pkey PRIMARY KEY (entity_id, key, ts))",
        "CREATE TABLE IF NOT EXISTS ts_kv_latest ("
            + " entity_id uuid NOT NULL, key int NOT NULL, ts bigint NOT NULL, bool_v boolean, str_v varchar,"
            + " long_v bigint, dbl_v double precision, json_v json,"
            + " CONSTRAINT ts_kv_latest_pkey PRIMARY KEY (entity_id, key))",
    };

    private Db() {
    }

    /** Waits (bounded) until Postgres accepts a connection; throws with a clear message otherwise. */
    static void awaitServer(Config cfg) {
        long deadline = System.nanoTime() + cfg.startupTimeoutSec * 1_000_000_000L;
        SQLException last = null;
        int attempt = 0;
        while (true) {
            attempt++;
            Properties p = props(cfg);
            p.setProperty("connectTimeout", "5");
            try (Connection c = DriverManager.getConnection(cfg.dbUrl, p)) {
                if (attempt > 1) log.info("Postgres reachable after {} attempts", attempt);
                return;
            } catch (SQLException e) {
                last = e;
                if (System.nanoTime() > deadline) break;
                if (attempt == 1 || attempt % 5 == 0) {
                    log.warn("Postgres not reachable at {} yet ({}); retrying", cfg.dbUrl, e.getMessage());
                }
                sleep(1000);
            }
        }
        throw new IllegalStateException("cannot connect to Postgres at " + cfg.dbUrl + " as '" + cfg.dbUser
            + "' within " + cfg.startupTimeoutSec + " s: " + last.getMessage(), last);
    }

    static HikariDataSource pool(Config cfg, int size) {
        HikariConfig hc = new HikariConfig();
        hc.setPoolName("tb-db");
        hc.setJdbcUrl(cfg.dbUrl);
        hc.setUsername(cfg.dbUser);
        hc.setPassword(cfg.dbPassword);
        hc.setMaximumPoolSize(size);
        hc.setMinimumIdle(1);
        hc.setConnectionTimeout(5000);
        hc.setValidationTimeout(3000);
        hc.setInitializationFailTimeout(10000);
        hc.addDataSourceProperty("connectTimeout", "5");
        hc.addDataSourceProperty("ApplicationName", "reference-platform");
        return new HikariDataSource(hc);
    }

    /**
     * DEFECT_DUPLICATE_ON_REDELIVERY: ts_kv without its primary key (a plain index instead), so that a message
     * inserted twice is stored twice. A ts_kv created earlier loses its primary key.
     */
    static final String[] TS_KV_WITHOUT_PK = {
        "CREATE TABLE IF NOT EXISTS ts_kv ("
            + " entity_id uuid NOT NULL, key int NOT NULL, ts bigint NOT NULL, bool_v boolean, str_v varchar,"
            + " long_v bigint, dbl_v double precision, json_v json)",
        "ALTER TABLE ts_kv DROP CONSTRAINT IF EXISTS ts_kv_pkey",
        "CREATE INDEX IF NOT EXISTS ts_kv_entity_key_ts ON ts_kv (entity_id, key, ts)",
    };

    /** Creates the schema if absent. An advisory lock serialises concurrent starters on one database. */
    static void createSchema(javax.sql.DataSource ds) throws SQLException {
        createSchema(ds, Defects.NONE);
    }

    static void createSchema(javax.sql.DataSource ds, Defects defects) throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try (Statement st = c.createStatement()) {
                st.execute("SELECT pg_advisory_xact_lock(7741001)");
                if (defects.duplicateOnRedelivery) {
                    for (String ddl : TS_KV_WITHOUT_PK) st.execute(ddl); // before SCHEMA's ts_kv (then a no-op)
                }
                for (String ddl : SCHEMA) st.execute(ddl);
                c.commit();
            } catch (SQLException e) {
                c.rollback();
                throw e;
            } finally {
                c.setAutoCommit(true);
            }
        }
    }

    private static Properties props(Config cfg) {
        Properties p = new Properties();
        p.setProperty("user", cfg.dbUser);
        p.setProperty("password", cfg.dbPassword);
        return p;
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
