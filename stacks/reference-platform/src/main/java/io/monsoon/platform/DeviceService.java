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
    private final DeviceStore store;
    private final DeviceLookup lookup;
    private final Map<UUID, Set<Channel>> sessions = new ConcurrentHashMap<>();

    /** {@code ds} holds device profiles (and, with the SQL registry, devices); {@code store} is the device registry. */
    DeviceService(DataSource ds, UUID tenantId, DeviceStore store, DeviceLookup lookup) {
        this.ds = ds;
        this.tenantId = tenantId;
        this.store = store;
        this.lookup = lookup;
    }

    // ---------------------------------------------------------------- device auth (transports)

    DeviceLookup lookup() {
        return lookup;
    }

    /** Token -> device through the lookup chain (HTTP device API); null when unknown. */
    DeviceInfo findByToken(String token) throws DeviceLookup.LookupFailed {
        if (token == null || token.isEmpty()) return null;
        return lookup.byTokenBlocking(token);
    }

    void registerSession(UUID deviceId, Channel ch) {
        sessions.computeIfAbsent(deviceId, k -> ConcurrentHashMap.newKeySet()).add(ch);
        ch.closeFuture().addListener(f -> {
            Set<Channel> s = sessions.get(deviceId);
            if (s != null) s.remove(ch);
        });
    }

    private void evictDevice(UUID deviceId, String token) {
        lookup.evict(deviceId, token);
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
        String type = text(body, "type");          // TB 4.2.1 defaults neither: 400 with its validator's words
        if (type == null) throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Device profile type should be specified!");
        String transport = text(body, "transportType");
        if (transport == null) throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Device profile transport type should be specified!");
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
    /** As ThingsBoard 4.2.1's findOrCreateDeviceProfile: look the profile up, create it when absent, with no
     *  guard against a concurrent creator. Two devices of a new type created at once race on
     *  device_profile_name_unq_key and the loser gets TB's 500 "Database error" (measured on real TB: 7 of 8
     *  concurrent creates failed so), which is why a client creates the profile once, before its devices. */
    private UUID profileForType(Connection c, String type) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement("SELECT id FROM device_profile WHERE name = ?")) {
            ps.setString(1, type);
            try (ResultSet rs = ps.executeQuery()) {
                if (rs.next()) return (UUID) rs.getObject(1);
            }
        }
        UUID id = UUID.randomUUID();
        try (PreparedStatement ps = c.prepareStatement(
            "INSERT INTO device_profile (id, created_time, name, type, transport_type, is_default, description)"
                + " VALUES (?, ?, ?, 'DEFAULT', 'DEFAULT', false, null)")) {
            ps.setObject(1, id);
            ps.setLong(2, System.currentTimeMillis());
            ps.setString(3, type);
            ps.executeUpdate();
        } catch (SQLException e) {
            if ("23505".equals(e.getSQLState())) throw new ApiException(500, ApiException.GENERAL, "Database error");
            throw e;
        }
        return id;
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

    // ---------------------------------------------------------------- devices (in the registry: SQL or Mongo)

    ObjectNode findDeviceByName(String name) throws Exception {
        return deviceJson(store.findByName(name));
    }

    ObjectNode getDevice(UUID id) throws Exception {
        return deviceJson(store.get(id));
    }

    /** GET /api/tenant/devices: a page of the registry's devices, searched by name substring and type. */
    ObjectNode listDevices(int pageSize, int page, String textSearch, String type) throws Exception {
        checkPage(pageSize, page);
        DeviceStore.Page p = store.list(pageSize, page, textSearch, type);
        List<ObjectNode> rows = new ArrayList<>();
        for (DeviceStore.DeviceRow r : p.rows()) rows.add(deviceJson(r));
        return pageJson(rows, p.total(), pageSize, page);
    }

    /** POST /api/device: create (with credentials) or, when the body carries an id, update. */
    ObjectNode saveDevice(JsonNode body, String accessToken) throws Exception {
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
        String[] profile;
        try (Connection c = ds.getConnection()) {
            if (profileId == null && type != null && !type.isBlank()) {
                profile = profileById(c, profileForType(c, type));
            } else {
                profile = profileById(c, profileId);
            }
        }
        if (type == null || type.isBlank()) type = profile[1];
        DeviceStore.DeviceRow row = new DeviceStore.DeviceRow(id, System.currentTimeMillis(), name, type, label,
            UUID.fromString(profile[0]));
        if (create) {
            store.create(row, token);
        } else {
            String oldToken = store.credentials(id).token();
            store.update(row, token);
            evictDevice(id, oldToken);
        }
        return getDevice(id);
    }

    /** GET /api/plugins/telemetry/DEVICE/{id}/values/timeseries: the device (in the registry: 404 when
     *  unknown) and its latest values from the store ({@link LatestTelemetry}). */
    ObjectNode latestTelemetry(UUID deviceId, String keys, boolean strict) throws Exception {
        store.get(deviceId);
        return LatestTelemetry.json(LatestTelemetry.read(ds, deviceId, LatestTelemetry.keys(keys)), strict);
    }

    void deleteDevice(UUID id) throws Exception {
        String token = store.delete(id);
        evictDevice(id, token);
    }

    ObjectNode credentials(UUID deviceId) throws Exception {
        DeviceStore.CredentialsRow r = store.credentials(deviceId);
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.putObject("id").put("id", r.id().toString());
        n.put("createdTime", r.createdTime());
        n.set("deviceId", entityIdJson("DEVICE", r.deviceId().toString()));
        n.put("credentialsType", "ACCESS_TOKEN");
        n.put("credentialsId", r.token());
        n.putNull("credentialsValue");
        return n;
    }

    // ---------------------------------------------------------------- JSON helpers

    private ObjectNode deviceJson(DeviceStore.DeviceRow d) {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.set("id", entityIdJson("DEVICE", d.id().toString()));
        n.put("createdTime", d.createdTime());
        n.set("tenantId", entityIdJson("TENANT", tenantId.toString()));
        n.set("customerId", entityIdJson("CUSTOMER", NULL_UUID.toString()));
        n.put("name", d.name());
        n.put("type", d.type());
        n.put("label", d.label());
        if (d.profileId() == null) n.putNull("deviceProfileId");
        else n.set("deviceProfileId", entityIdJson("DEVICE_PROFILE", d.profileId().toString()));
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

    private static void checkPage(int pageSize, int page) {
        if (pageSize < 1) throw ApiException.badRequest("Page size should be greater than 0!");
        if (page < 0) throw ApiException.badRequest("Page should be greater than or equal to 0!");
    }

    private static ObjectNode pageJson(List<ObjectNode> rows, long total, int pageSize, int page) {
        ObjectNode out = TelemetryParser.MAPPER.createObjectNode();
        ArrayNode data = out.putArray("data");
        rows.forEach(data::add);
        out.put("totalPages", (total + pageSize - 1) / pageSize);
        out.put("totalElements", total);
        out.put("hasNext", (long) (page + 1) * pageSize < total);
        return out;
    }

    /** Profiles page (Postgres). */
    private ObjectNode page(String sql, String countSql, String textSearch, int pageSize, int page, RowMapper mapper)
        throws SQLException {
        checkPage(pageSize, page);
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
            return pageJson(rows, total, pageSize, page);
        }
    }

    private static String text(JsonNode body, String field) {
        JsonNode v = body.get(field);
        return v == null || v.isNull() ? null : v.asText();
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
