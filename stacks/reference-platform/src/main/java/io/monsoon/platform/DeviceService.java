package io.monsoon.platform;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.netty.channel.Channel;
import org.postgresql.util.PSQLException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import javax.sql.DataSource;
import java.security.SecureRandom;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;

/** Device profiles, devices and access-token credentials (ThingsBoard's tables and JSON shapes). */
final class DeviceService {
    private static final Logger log = LoggerFactory.getLogger(DeviceService.class);
    static final UUID NULL_UUID = UUID.fromString("13814000-1dd2-11b2-8080-808080808080");
    private static final String ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    private static final SecureRandom RANDOM = new SecureRandom();

    /** What the transports need to know about an authenticated device (cached by token). */
    static final class DeviceInfo {
        final UUID id;
        final String name;
        final String type;

        DeviceInfo(UUID id, String name, String type) {
            this.id = id;
            this.name = name;
            this.type = type;
        }
    }

    private final DataSource ds;
    final UUID tenantId;
    private final Map<String, DeviceInfo> tokenCache = new ConcurrentHashMap<>();
    private final Map<UUID, Set<Channel>> sessions = new ConcurrentHashMap<>();

    DeviceService(DataSource ds, UUID tenantId) {
        this.ds = ds;
        this.tenantId = tenantId;
    }

    // ---------------------------------------------------------------- device auth (transports)

    /** Token -> device, from the in-memory cache or device_credentials; null when unknown. */
    DeviceInfo findByToken(String token) throws SQLException {
        if (token == null || token.isEmpty()) return null;
        DeviceInfo cached = tokenCache.get(token);
        if (cached != null) return cached;
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT d.id, d.name, d.type FROM device_credentials dc JOIN device d ON d.id = dc.device_id"
                     + " WHERE dc.credentials_type = 'ACCESS_TOKEN' AND dc.credentials_id = ?")) {
            ps.setString(1, token);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) return null;
                DeviceInfo info = new DeviceInfo((UUID) rs.getObject(1), rs.getString(2), rs.getString(3));
                tokenCache.put(token, info);
                return info;
            }
        }
    }

    void registerSession(UUID deviceId, Channel ch) {
        sessions.computeIfAbsent(deviceId, k -> ConcurrentHashMap.newKeySet()).add(ch);
        ch.closeFuture().addListener(f -> {
            Set<Channel> s = sessions.get(deviceId);
            if (s != null) s.remove(ch);
        });
    }

    private void evictDevice(UUID deviceId) {
        tokenCache.values().removeIf(d -> d.id.equals(deviceId));
        Set<Channel> s = sessions.remove(deviceId);
        if (s != null) s.forEach(Channel::close);
    }

    // ---------------------------------------------------------------- device profiles

    void ensureDefaultProfile() throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try {
                try (PreparedStatement ps = c.prepareStatement("SELECT pg_advisory_xact_lock(7741002)")) {
                    ps.execute();
                }
                boolean hasDefault;
                try (PreparedStatement ps = c.prepareStatement("SELECT 1 FROM device_profile WHERE is_default");
                     ResultSet rs = ps.executeQuery()) {
                    hasDefault = rs.next();
                }
                try (PreparedStatement ps = c.prepareStatement(
                    "INSERT INTO device_profile (id, created_time, name, type, transport_type, is_default, description)"
                        + " VALUES (?, ?, 'default', 'DEFAULT', 'DEFAULT', ?, 'Default device profile')"
                        + " ON CONFLICT (name) DO NOTHING")) {
                    ps.setObject(1, UUID.randomUUID());
                    ps.setLong(2, System.currentTimeMillis());
                    ps.setBoolean(3, !hasDefault);
                    ps.executeUpdate();
                }
                c.commit();
            } catch (SQLException e) {
                c.rollback();
                throw e;
            }
        }
    }

    ObjectNode listProfiles(int pageSize, int page, String textSearch) throws SQLException {
        String where = textSearch == null || textSearch.isEmpty() ? "" : " WHERE name ILIKE ?";
        return page("SELECT id, created_time, name, type, transport_type, is_default, description FROM device_profile"
            + where + " ORDER BY created_time, name", "SELECT count(*) FROM device_profile" + where,
            textSearch, pageSize, page, this::profileJson);
    }

    ObjectNode getProfile(UUID id) throws SQLException {
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT id, created_time, name, type, transport_type, is_default, description FROM device_profile WHERE id = ?")) {
            ps.setObject(1, id);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) throw ApiException.notFound();
                return profileJson(rs);
            }
        }
    }

    ObjectNode saveProfile(JsonNode body) throws SQLException {
        String name = text(body, "name");
        if (name == null || name.isBlank()) throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Device profile name should be specified!");
        String type = defaultIfNull(text(body, "type"), "DEFAULT");
        String transport = defaultIfNull(text(body, "transportType"), "DEFAULT");
        String description = text(body, "description");
        boolean isDefault = body.path("default").asBoolean(false);
        UUID id = entityId(body.get("id"));
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try {
                if (isDefault) {
                    try (PreparedStatement ps = c.prepareStatement("UPDATE device_profile SET is_default = false WHERE is_default")) {
                        ps.executeUpdate();
                    }
                }
                if (id == null) {
                    id = UUID.randomUUID();
                    try (PreparedStatement ps = c.prepareStatement(
                        "INSERT INTO device_profile (id, created_time, name, type, transport_type, is_default, description)"
                            + " VALUES (?, ?, ?, ?, ?, ?, ?)")) {
                        ps.setObject(1, id);
                        ps.setLong(2, System.currentTimeMillis());
                        ps.setString(3, name);
                        ps.setString(4, type);
                        ps.setString(5, transport);
                        ps.setBoolean(6, isDefault);
                        ps.setString(7, description);
                        ps.executeUpdate();
                    }
                } else {
                    try (PreparedStatement ps = c.prepareStatement(
                        "UPDATE device_profile SET name = ?, type = ?, transport_type = ?, is_default = ?, description = ?"
                            + " WHERE id = ?")) {
                        ps.setString(1, name);
                        ps.setString(2, type);
                        ps.setString(3, transport);
                        ps.setBoolean(4, isDefault);
                        ps.setString(5, description);
                        ps.setObject(6, id);
                        if (ps.executeUpdate() == 0) throw ApiException.notFound();
                    }
                }
                c.commit();
            } catch (PSQLException e) {
                c.rollback();
                if ("23505".equals(e.getSQLState())) throw ApiException.badRequest("Device profile with such name already exists!");
                throw e;
            } catch (SQLException | RuntimeException e) {
                c.rollback();
                throw e;
            }
        }
        return getProfile(id);
    }

    /** TB's findOrCreateDeviceProfile(tenant, type): the profile named after a device type. */
    private UUID profileForType(Connection c, String type) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(
            "INSERT INTO device_profile (id, created_time, name, type, transport_type, is_default, description)"
                + " VALUES (?, ?, ?, 'DEFAULT', 'DEFAULT', false, null) ON CONFLICT (name) DO NOTHING")) {
            ps.setObject(1, UUID.randomUUID());
            ps.setLong(2, System.currentTimeMillis());
            ps.setString(3, type);
            ps.executeUpdate();
        }
        try (PreparedStatement ps = c.prepareStatement("SELECT id FROM device_profile WHERE name = ?")) {
            ps.setString(1, type);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return (UUID) rs.getObject(1);
            }
        }
    }

    private String[] profileById(Connection c, UUID profileId) throws SQLException {
        String sql = profileId == null
            ? "SELECT id, name FROM device_profile ORDER BY is_default DESC, created_time LIMIT 1"
            : "SELECT id, name FROM device_profile WHERE id = ?";
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            if (profileId != null) ps.setObject(1, profileId);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    if (profileId == null) throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Default device profile is missing!");
                    throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Device is referencing a non-existent device profile!");
                }
                return new String[]{rs.getObject(1).toString(), rs.getString(2)};
            }
        }
    }

    // ---------------------------------------------------------------- devices

    private static final String DEVICE_COLS = "id, created_time, name, type, label, device_profile_id";

    ObjectNode findDeviceByName(String name) throws SQLException {
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement("SELECT " + DEVICE_COLS + " FROM device WHERE name = ?")) {
            ps.setString(1, name);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) throw ApiException.notFound();
                return deviceJson(rs);
            }
        }
    }

    ObjectNode getDevice(UUID id) throws SQLException {
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement("SELECT " + DEVICE_COLS + " FROM device WHERE id = ?")) {
            ps.setObject(1, id);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) throw ApiException.notFound();
                return deviceJson(rs);
            }
        }
    }

    ObjectNode listDevices(int pageSize, int page, String textSearch) throws SQLException {
        String where = textSearch == null || textSearch.isEmpty() ? "" : " WHERE name ILIKE ?";
        return page("SELECT " + DEVICE_COLS + " FROM device" + where + " ORDER BY created_time, name",
            "SELECT count(*) FROM device" + where, textSearch, pageSize, page, this::deviceJson);
    }

    /** POST /api/device: create (with credentials) or, when the body carries an id, update. */
    ObjectNode saveDevice(JsonNode body, String accessToken) throws SQLException {
        String name = text(body, "name");
        if (name == null || name.isBlank()) throw ApiException.badRequest("Device name should be specified!");
        String type = text(body, "type");
        String label = text(body, "label");
        UUID profileId = entityId(body.get("deviceProfileId"));
        UUID id = entityId(body.get("id"));
        boolean create = id == null;
        if (create) id = UUID.randomUUID();
        String token = accessToken;
        if (create && (token == null || token.isEmpty())) token = randomToken();
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try {
                String[] profile;
                if (profileId == null && type != null && !type.isBlank()) {
                    profile = profileById(c, profileForType(c, type));
                } else {
                    profile = profileById(c, profileId);
                }
                if (type == null || type.isBlank()) type = profile[1];
                if (create) {
                    try (PreparedStatement ps = c.prepareStatement(
                        "INSERT INTO device (id, created_time, name, type, label, device_profile_id) VALUES (?, ?, ?, ?, ?, ?)")) {
                        ps.setObject(1, id);
                        ps.setLong(2, System.currentTimeMillis());
                        ps.setString(3, name);
                        ps.setString(4, type);
                        ps.setString(5, label);
                        ps.setObject(6, UUID.fromString(profile[0]));
                        ps.executeUpdate();
                    }
                    try (PreparedStatement ps = c.prepareStatement(
                        "INSERT INTO device_credentials (id, created_time, device_id, credentials_type, credentials_id)"
                            + " VALUES (?, ?, ?, 'ACCESS_TOKEN', ?)")) {
                        ps.setObject(1, UUID.randomUUID());
                        ps.setLong(2, System.currentTimeMillis());
                        ps.setObject(3, id);
                        ps.setString(4, token);
                        ps.executeUpdate();
                    }
                } else {
                    try (PreparedStatement ps = c.prepareStatement(
                        "UPDATE device SET name = ?, type = ?, label = ?, device_profile_id = ? WHERE id = ?")) {
                        ps.setString(1, name);
                        ps.setString(2, type);
                        ps.setString(3, label);
                        ps.setObject(4, UUID.fromString(profile[0]));
                        ps.setObject(5, id);
                        if (ps.executeUpdate() == 0) throw ApiException.notFound();
                    }
                    if (token != null && !token.isEmpty()) {
                        try (PreparedStatement ps = c.prepareStatement(
                            "UPDATE device_credentials SET credentials_id = ? WHERE device_id = ?")) {
                            ps.setString(1, token);
                            ps.setObject(2, id);
                            ps.executeUpdate();
                        }
                    }
                }
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
            }
        }
        if (!create) evictDevice(id);
        return getDevice(id);
    }

    void deleteDevice(UUID id) throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            try {
                int n;
                try (PreparedStatement ps = c.prepareStatement("DELETE FROM device WHERE id = ?")) {
                    ps.setObject(1, id);
                    n = ps.executeUpdate();
                }
                try (PreparedStatement ps = c.prepareStatement("DELETE FROM device_credentials WHERE device_id = ?")) {
                    ps.setObject(1, id);
                    ps.executeUpdate();
                }
                c.commit();
                if (n == 0) throw ApiException.notFound();
            } catch (SQLException | RuntimeException e) {
                c.rollback();
                throw e;
            }
        }
        evictDevice(id);
    }

    ObjectNode credentials(UUID deviceId) throws SQLException {
        try (Connection c = ds.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT id, created_time, device_id, credentials_type, credentials_id FROM device_credentials WHERE device_id = ?")) {
            ps.setObject(1, deviceId);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) throw ApiException.notFound();
                ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
                n.putObject("id").put("id", rs.getObject(1).toString());
                n.put("createdTime", rs.getLong(2));
                n.set("deviceId", entityIdJson("DEVICE", rs.getObject(3).toString()));
                n.put("credentialsType", rs.getString(4));
                n.put("credentialsId", rs.getString(5));
                n.putNull("credentialsValue");
                return n;
            }
        }
    }

    // ---------------------------------------------------------------- JSON helpers

    private ObjectNode deviceJson(ResultSet rs) throws SQLException {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.set("id", entityIdJson("DEVICE", rs.getObject("id").toString()));
        n.put("createdTime", rs.getLong("created_time"));
        n.set("tenantId", entityIdJson("TENANT", tenantId.toString()));
        n.set("customerId", entityIdJson("CUSTOMER", NULL_UUID.toString()));
        n.put("name", rs.getString("name"));
        n.put("type", rs.getString("type"));
        n.put("label", rs.getString("label"));
        Object profile = rs.getObject("device_profile_id");
        if (profile == null) n.putNull("deviceProfileId");
        else n.set("deviceProfileId", entityIdJson("DEVICE_PROFILE", profile.toString()));
        n.putNull("firmwareId");
        n.putNull("softwareId");
        n.putNull("externalId");
        n.putNull("additionalInfo");
        return n;
    }

    private ObjectNode profileJson(ResultSet rs) throws SQLException {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.set("id", entityIdJson("DEVICE_PROFILE", rs.getObject("id").toString()));
        n.put("createdTime", rs.getLong("created_time"));
        n.set("tenantId", entityIdJson("TENANT", tenantId.toString()));
        n.put("name", rs.getString("name"));
        n.put("description", rs.getString("description"));
        n.put("type", rs.getString("type"));
        n.put("transportType", rs.getString("transport_type"));
        n.put("provisionType", "DISABLED");
        n.put("default", rs.getBoolean("is_default"));
        n.putNull("defaultRuleChainId");
        n.putNull("defaultQueueName");
        ObjectNode pd = n.putObject("profileData");
        pd.putObject("configuration").put("type", "DEFAULT");
        pd.putObject("transportConfiguration").put("type", "DEFAULT");
        pd.putObject("provisionConfiguration").put("type", "DISABLED").putNull("provisionDeviceSecret");
        pd.putNull("alarms");
        return n;
    }

    static ObjectNode entityIdJson(String type, String id) {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.put("entityType", type);
        n.put("id", id);
        return n;
    }

    private interface RowMapper {
        ObjectNode map(ResultSet rs) throws SQLException;
    }

    private ObjectNode page(String sql, String countSql, String textSearch, int pageSize, int page, RowMapper mapper)
        throws SQLException {
        if (pageSize < 1) throw ApiException.badRequest("Page size should be greater than 0!");
        if (page < 0) throw ApiException.badRequest("Page should be greater than or equal to 0!");
        boolean filter = textSearch != null && !textSearch.isEmpty();
        try (Connection c = ds.getConnection()) {
            long total;
            try (PreparedStatement ps = c.prepareStatement(countSql)) {
                if (filter) ps.setString(1, "%" + textSearch + "%");
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    total = rs.getLong(1);
                }
            }
            List<ObjectNode> rows = new ArrayList<>();
            try (PreparedStatement ps = c.prepareStatement(sql + " LIMIT ? OFFSET ?")) {
                int i = 1;
                if (filter) ps.setString(i++, "%" + textSearch + "%");
                ps.setInt(i++, pageSize);
                ps.setLong(i, (long) page * pageSize);
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) rows.add(mapper.map(rs));
                }
            }
            ObjectNode out = TelemetryParser.MAPPER.createObjectNode();
            ArrayNode data = out.putArray("data");
            rows.forEach(data::add);
            out.put("totalPages", (total + pageSize - 1) / pageSize);
            out.put("totalElements", total);
            out.put("hasNext", (long) (page + 1) * pageSize < total);
            return out;
        }
    }

    private static String text(JsonNode body, String field) {
        JsonNode v = body.get(field);
        return v == null || v.isNull() ? null : v.asText();
    }

    private static String defaultIfNull(String v, String def) {
        return v == null || v.isBlank() ? def : v;
    }

    /** Accepts TB's {"entityType":..,"id":..} or a bare UUID string; null when absent. */
    static UUID entityId(JsonNode node) {
        if (node == null || node.isNull()) return null;
        JsonNode idNode = node.isObject() ? node.get("id") : node;
        if (idNode == null || idNode.isNull()) return null;
        try {
            return UUID.fromString(idNode.asText());
        } catch (IllegalArgumentException e) {
            throw ApiException.badRequest("Invalid UUID string: " + idNode.asText());
        }
    }

    static String randomToken() {
        StringBuilder sb = new StringBuilder(20);
        for (int i = 0; i < 20; i++) sb.append(ALNUM.charAt(RANDOM.nextInt(ALNUM.length())));
        return sb.toString();
    }
}
