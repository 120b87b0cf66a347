package io.monsoon.platform;

import org.postgresql.util.PSQLException;

import javax.sql.DataSource;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.Semaphore;

/**
 * The default registry (REGISTRY_TYPE=sql): ThingsBoard's {@code device} and {@code device_credentials} tables.
 * Also owns the Postgres {@code device} row that the Mongo registry mirrors as the storage-side entity
 * (the loss query joins {@code ts_kv} with {@code device} for names).
 */
final class SqlDeviceStore implements DeviceStore {
    private static final String COLS = "id, created_time, name, type, label, device_profile_id";
    /** Lookups from the transports share the pool with storage: at most this many at once (as the old 4-thread auth pool). */
    private final Semaphore lookupPermits = new Semaphore(4);
    private final DataSource ds;

    SqlDeviceStore(DataSource ds) {
        this.ds = ds;
    }

    @Override
    public String name() {
        return "sql";
    }

    @Override
    public UUID deviceIdByToken(String token) throws Exception {
        lookupPermits.acquire();
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement("SELECT device_id FROM device_credentials"
                 + " WHERE credentials_type = 'ACCESS_TOKEN' AND credentials_id = ?")) {
            ps.setString(1, token);
            try (ResultSet rs = ps.executeQuery()) {
                return rs.next() ? (UUID) rs.getObject(1) : null;
            }
        } finally {
            lookupPermits.release();
        }
    }

    @Override
    public DeviceRow deviceById(UUID id) throws Exception {
        lookupPermits.acquire();
        try {
            return select("SELECT " + COLS + " FROM device WHERE id = ?", id);
        } finally {
            lookupPermits.release();
        }
    }

    @Override
    public DeviceRow findByName(String name) throws SQLException {
        DeviceRow r = select("SELECT " + COLS + " FROM device WHERE name = ?", name);
        if (r == null) throw ApiException.notFound();
        return r;
    }

    @Override
    public DeviceRow get(UUID id) throws SQLException {
        DeviceRow r = select("SELECT " + COLS + " FROM device WHERE id = ?", id);
        if (r == null) throw ApiException.notFound();
        return r;
    }

    private DeviceRow select(String sql, Object arg) throws SQLException {
        try (Connection c = ds.getConnection(); PreparedStatement ps = c.prepareStatement(sql)) {
            ps.setObject(1, arg);
            try (ResultSet rs = ps.executeQuery()) {
                return rs.next() ? row(rs) : null;
            }
        }
    }

    @Override
    public Page list(int pageSize, int page, String textSearch, String type) throws SQLException {
        List<String> args = new ArrayList<>();
        String where = where(textSearch, type, args);
        try (Connection c = ds.getConnection()) {
            long total;
            try (PreparedStatement ps = c.prepareStatement("SELECT count(*) FROM device" + where)) {
                for (int i = 0; i < args.size(); i++) ps.setString(i + 1, args.get(i));
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    total = rs.getLong(1);
                }
            }
            List<DeviceRow> rows = new ArrayList<>();
            try (PreparedStatement ps = c.prepareStatement(
                "SELECT " + COLS + " FROM device" + where + " ORDER BY created_time, name LIMIT ? OFFSET ?")) {
                int i = 1;
                for (String a : args) ps.setString(i++, a);
                ps.setInt(i++, pageSize);
                ps.setLong(i, (long) page * pageSize);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) rows.add(row(rs));
                }
            }
            return new Page(rows, total);
        }
    }

    /** The search's WHERE clause ("" when nothing filters), its parameters appended to {@code args}. */
    static String where(String textSearch, String type, List<String> args) {
        List<String> conds = new ArrayList<>();
        if (textSearch != null && !textSearch.isEmpty()) {
            conds.add("name ILIKE ?");
            args.add("%" + textSearch + "%");
        }
        if (type != null && !type.isEmpty()) {
            conds.add("type = ?");
            args.add(type);
        }
        return conds.isEmpty() ? "" : " WHERE " + String.join(" AND ", conds);
    }

    @Override
    public void create(DeviceRow d, String token) throws SQLException {
        inTransaction(c -> {
            insertDevice(c, d);
            try (PreparedStatement ps = c.prepareStatement(
                "INSERT INTO device_credentials (id, created_time, device_id, credentials_type, credentials_id)"
                    + " VALUES (?, ?, ?, 'ACCESS_TOKEN', ?)")) {
                ps.setObject(1, UUID.randomUUID());
                ps.setLong(2, System.currentTimeMillis());
                ps.setObject(3, d.id());
                ps.setString(4, token);
                ps.executeUpdate();
            }
        });
    }

    @Override
    public void update(DeviceRow d, String token) throws SQLException {
        inTransaction(c -> {
            if (updateDevice(c, d) == 0) throw ApiException.notFound();
            if (token != null && !token.isEmpty()) {
                try (PreparedStatement ps = c.prepareStatement(
                    "UPDATE device_credentials SET credentials_id = ? WHERE device_id = ?")) {
                    ps.setString(1, token);
                    ps.setObject(2, d.id());
                    ps.executeUpdate();
                }
            }
        });
    }

    @Override
    public String delete(UUID id) throws SQLException {
        String[] token = new String[1];
        inTransaction(c -> {
            try (PreparedStatement ps = c.prepareStatement(
                "DELETE FROM device_credentials WHERE device_id = ? RETURNING credentials_id")) {
                ps.setObject(1, id);
                try (ResultSet rs = ps.executeQuery()) {
                    if (rs.next()) token[0] = rs.getString(1);
                }
            }
            if (deleteDevice(c, id) == 0) throw ApiException.notFound();
        });
        return token[0];
    }

    @Override
    public CredentialsRow credentials(UUID deviceId) throws SQLException {
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT id, created_time, device_id, credentials_id FROM device_credentials WHERE device_id = ?")) {
            ps.setObject(1, deviceId);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) throw ApiException.notFound();
                return new CredentialsRow((UUID) rs.getObject(1), rs.getLong(2), (UUID) rs.getObject(3), rs.getString(4));
            }
        }
    }

    // ---------------------------------------------------------------- the storage-side mirror (REGISTRY_TYPE=mongo)

    /**
     * Writes the Postgres {@code device} row of a device whose registry is Mongo, so that storage-side
     * queries (the loss query's join) resolve names. Mongo is the source of truth: a stale row holding
     * the same name under another id is replaced.
     */
    void mirrorUpsert(DeviceRow d) throws SQLException {
        inTransaction(c -> {
            try (PreparedStatement ps = c.prepareStatement("DELETE FROM device WHERE name = ? AND id <> ?")) {
                ps.setString(1, d.name());
                ps.setObject(2, d.id());
                ps.executeUpdate();
            }
            if (updateDevice(c, d) == 0) insertDevice(c, d);
        });
    }

    void mirrorDelete(UUID id) throws SQLException {
        inTransaction(c -> deleteDevice(c, id));
    }

    // ---------------------------------------------------------------- helpers

    private static void insertDevice(Connection c, DeviceRow d) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("INSERT INTO device (" + COLS + ") VALUES (?, ?, ?, ?, ?, ?)")) {
            ps.setObject(1, d.id());
            ps.setLong(2, d.createdTime());
            ps.setString(3, d.name());
            ps.setString(4, d.type());
            ps.setString(5, d.label());
            ps.setObject(6, d.profileId());
            ps.executeUpdate();
        }
    }

    private static int updateDevice(Connection c, DeviceRow d) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(
            "UPDATE device SET name = ?, type = ?, label = ?, device_profile_id = ? WHERE id = ?")) {
            ps.setString(1, d.name());
            ps.setString(2, d.type());
            ps.setString(3, d.label());
            ps.setObject(4, d.profileId());
            ps.setObject(5, d.id());
            return ps.executeUpdate();
        }
    }

    private static int deleteDevice(Connection c, UUID id) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("DELETE FROM device WHERE id = ?")) {
            ps.setObject(1, id);
            return ps.executeUpdate();
        }
    }

    private static DeviceRow row(ResultSet rs) throws SQLException {
        return new DeviceRow((UUID) rs.getObject("id"), rs.getLong("created_time"), rs.getString("name"),
            rs.getString("type"), rs.getString("label"), (UUID) rs.getObject("device_profile_id"));
    }

    private interface TxBody {
        void run(Connection c) throws SQLException;
    }

    /** Runs {@code body} in one transaction; unique violations become TB's 400 answers. */
    private void inTransaction(TxBody body) throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try {
                body.run(c);
                c.commit();
            } catch (PSQLException e) {
                c.rollback();
                if ("23505".equals(e.getSQLState())) {
                    String constraint = e.getServerErrorMessage() == null ? null : e.getServerErrorMessage().getConstraint();
                    if (constraint != null && constraint.startsWith("device_credentials")) {
                        throw ApiException.badRequest("Specified credentials are already registered!");
                    }
                    throw ApiException.badRequest("Device with such name already exists!");
                }
                throw e;
            } catch (SQLException | RuntimeException e) {
                c.rollback();
                throw e;
            } finally {
                c.setAutoCommit(true);
            }
        }
    }
}
