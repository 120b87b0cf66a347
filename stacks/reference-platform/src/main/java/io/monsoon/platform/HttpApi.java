package io.monsoon.platform;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * One HTTP port for the ThingsBoard REST API subset, the device HTTP API, /metrics and /health.
 * Built on the JDK's com.sun.net.httpserver with a fixed worker pool.
 */
final class HttpApi {
    private static final Logger log = LoggerFactory.getLogger(HttpApi.class);
    private static final int MAX_BODY = 1 << 20;

    /** The reference platform's version (its pom's), as /actuator/info says it. */
    static final String VERSION = "0.1.0";
    private final Config cfg;
    private final BooleanSupplier healthy;
    private volatile DeviceService devices;
    private volatile TbQueue queue;
    private final JwtService jwt;
    private HttpServer server;
    private ExecutorService pool;     // the API's 16 workers
    private ExecutorService monitor;  // the server's own threads: /metrics and /health, then hand-off to pool
    private final RateLimitedLog badPayloadLog = new RateLimitedLog(log, 1000);

    HttpApi(Config cfg, JwtService jwt, BooleanSupplier healthy) {
        this.cfg = cfg;
        this.jwt = jwt;
        this.healthy = healthy;
    }

    /** Wires the services once the database and queue are up (until then /api answers 503). */
    void attach(DeviceService devices, TbQueue queue) {
        this.devices = devices;
        this.queue = queue;
    }

    void start() {
        try {
            server = HttpServer.create(new InetSocketAddress(cfg.httpHost, cfg.httpPort), 256);
        } catch (IOException e) {
            throw new IllegalStateException("cannot bind HTTP to " + cfg.httpHost + ":" + cfg.httpPort + ": " + e, e);
        }
        pool = Executors.newFixedThreadPool(16, r -> {
            Thread t = new Thread(r, "tb-http");
            t.setDaemon(true);
            return t;
        });
        monitor = Executors.newFixedThreadPool(2, r -> {
            Thread t = new Thread(r, "tb-http-monitor");
            t.setDaemon(true);
            return t;
        });
        // /metrics and /health answer on the server's own threads, the API on its 16 workers: a saturated API
        // (slow registry reads) must not hide the JVM's metrics (GC time) exactly when they matter, as with
        // ThingsBoard, whose actuator answers from Tomcat's 200 threads beside its REST API
        server.setExecutor(monitor);
        server.createContext("/", ex -> {
            if (monitoring(ex.getRequestURI().getRawPath())) {
                handle(ex);
                return;
            }
            try {
                pool.execute(() -> handle(ex));
            } catch (RejectedExecutionException e) {   // stopping
                ex.close();
            }
        });
        server.start();
        log.info("HTTP listening on {}:{}", cfg.httpHost, cfg.httpPort);
    }

    void stop() {
        if (server != null) server.stop(0);
        if (pool != null) pool.shutdownNow();
        if (monitor != null) monitor.shutdownNow();
    }

    /** Paths served on the server's own threads, never queued behind the API's requests. */
    static boolean monitoring(String path) {
        return "/metrics".equals(path) || "/health".equals(path);
    }

    private void handle(HttpExchange ex) {
        try (ex) {
            String method = ex.getRequestMethod();
            String path = ex.getRequestURI().getRawPath();
            Map<String, String> query = parseQuery(ex.getRequestURI().getRawQuery());
            try {
                route(ex, method, path, query);
            } catch (ApiException e) {
                sendError(ex, e.status, e.errorCode, e.getMessage());
            } catch (Exception e) {
                log.warn("{} {} failed: {}", method, path, e.toString());
                sendError(ex, 500, ApiException.GENERAL, e.getMessage() == null ? e.toString() : e.getMessage());
            }
        } catch (Exception e) {
            log.debug("HTTP exchange failed: {}", e.toString());
        }
    }

    private void route(HttpExchange ex, String method, String path, Map<String, String> q) throws Exception {
        if (path.equals("/health")) {
            boolean up = healthy.getAsBoolean();
            sendJson(ex, up ? 200 : 503, up ? "{\"status\":\"UP\"}" : "{\"status\":\"DOWN\"}");
            return;
        }
        if (path.equals("/metrics")) {
            ByteArrayOutputStream out = new ByteArrayOutputStream(16384);
            Metrics.write(out);
            send(ex, 200, Metrics.contentType(), out.toByteArray());
            return;
        }
        // what the platform is, in Spring Boot actuator's shapes as ThingsBoard answers them (with
        // METRICS_ENDPOINTS_EXPOSE=prometheus,info,env): /actuator/info and /actuator/env/{property}
        if (path.equals("/actuator/info")) {
            ObjectNode info = TelemetryParser.MAPPER.createObjectNode();
            ObjectNode build = info.putObject("build");
            build.put("name", "monsoon reference platform");
            build.put("version", VERSION);
            sendJson(ex, 200, info);
            return;
        }
        if (path.startsWith("/actuator/env/")) {
            String name = path.substring("/actuator/env/".length());
            String value = switch (name) {
                case "queue.type" -> cfg.queueType;
                case "database.ts.type" -> cfg.tsType;
                default -> null;
            };
            if (value == null) throw ApiException.notFound();
            ObjectNode env = TelemetryParser.MAPPER.createObjectNode();
            ObjectNode property = env.putObject("property");
            property.put("source", "systemEnvironment");
            property.put("value", value);
            sendJson(ex, 200, env);
            return;
        }
        if (!path.startsWith("/api/")) throw ApiException.notFound();
        DeviceService devices = this.devices;
        TbQueue queue = this.queue;
        if (devices == null || queue == null) {
            throw new ApiException(503, ApiException.GENERAL, "Service is starting");
        }
        String[] parts = path.substring(1).split("/");
        // ---- device HTTP API: /api/v1/{token}/{telemetry|attributes}
        if (parts.length == 4 && parts[1].equals("v1")) {
            if (!method.equals("POST")) throw new ApiException(405, ApiException.GENERAL, "Request method '" + method + "' is not supported");
            deviceApi(ex, devices, queue, URLDecoder.decode(parts[2], StandardCharsets.UTF_8), parts[3]);
            return;
        }
        // ---- authentication
        if (path.equals("/api/auth/login") && method.equals("POST")) {
            JsonNode body = readJsonOrNull(ex);
            String user = body == null ? null : body.path("username").asText(null);
            String pass = body == null ? null : body.path("password").asText(null);
            if (user == null || pass == null || !jwt.checkPassword(user, pass)) {
                throw new ApiException(401, ApiException.AUTHENTICATION, "Authentication failed");
            }
            sendPair(ex, user);
            return;
        }
        if (path.equals("/api/auth/token") && method.equals("POST")) {
            JsonNode body = readJsonOrNull(ex);
            String refresh = body == null ? null : body.path("refreshToken").asText(null);
            if (refresh == null) throw new ApiException(401, ApiException.AUTHENTICATION, "Authentication failed");
            String sub = jwt.verify(refresh, "REFRESH_TOKEN").getSubject();
            sendPair(ex, sub);
            return;
        }
        // ---- everything else needs X-Authorization: Bearer <token>
        String auth = ex.getRequestHeaders().getFirst("X-Authorization");
        if (auth == null) auth = ex.getRequestHeaders().getFirst("Authorization");
        if (auth == null || !auth.startsWith("Bearer ")) {
            throw new ApiException(401, ApiException.AUTHENTICATION, "Authentication failed");
        }
        String sub = jwt.verify(auth.substring(7).trim(), "TENANT_ADMIN").getSubject();

        if (path.equals("/api/auth/user") && method.equals("GET")) {
            ObjectNode u = TelemetryParser.MAPPER.createObjectNode();
            u.set("id", DeviceService.entityIdJson("USER", jwt.userId.toString()));
            u.set("tenantId", DeviceService.entityIdJson("TENANT", jwt.tenantId.toString()));
            u.set("customerId", DeviceService.entityIdJson("CUSTOMER", DeviceService.NULL_UUID.toString()));
            u.put("email", sub);
            u.put("name", sub);
            u.put("authority", "TENANT_ADMIN");
            sendJson(ex, 200, u);
            return;
        }
        if (path.equals("/api/deviceProfiles") && method.equals("GET")) {
            sendJson(ex, 200, devices.listProfiles(intParam(q, "pageSize", 10), intParam(q, "page", 0), q.get("textSearch")));
            return;
        }
        if (path.equals("/api/deviceProfile") && method.equals("POST")) {
            sendJson(ex, 200, devices.saveProfile(readJson(ex)));
            return;
        }
        if (parts.length == 3 && parts[1].equals("deviceProfile") && method.equals("GET")) {
            sendJson(ex, 200, devices.getProfile(uuid(parts[2])));
            return;
        }
        if (path.equals("/api/tenant/devices") && method.equals("GET")) {
            String name = q.get("deviceName");
            if (name != null) sendJson(ex, 200, devices.findDeviceByName(name));
            else sendJson(ex, 200, devices.listDevices(intParam(q, "pageSize", 10), intParam(q, "page", 0),
                q.get("textSearch"), q.get("type")));
            return;
        }
        if (path.equals("/api/device") && method.equals("POST")) {
            sendJson(ex, 200, devices.saveDevice(readJson(ex), q.get("accessToken")));
            return;
        }
        if (parts.length == 3 && parts[1].equals("device")) {
            UUID id = uuid(parts[2]);
            if (method.equals("GET")) {
                sendJson(ex, 200, devices.getDevice(id));
                return;
            }
            if (method.equals("DELETE")) {
                devices.deleteDevice(id);
                send(ex, 200, null, new byte[0]);
                return;
            }
        }
        // ThingsBoard's latest telemetry of one device (what a dashboard reads): registry + store
        if (parts.length == 7 && parts[1].equals("plugins") && parts[2].equals("telemetry") && parts[3].equals("DEVICE")
            && parts[5].equals("values") && parts[6].equals("timeseries") && method.equals("GET")) {
            sendJson(ex, 200, devices.latestTelemetry(uuid(parts[4]), q.get("keys"),
                "true".equals(q.get("useStrictDataTypes"))));
            return;
        }
        if (parts.length == 4 && parts[1].equals("device") && parts[3].equals("credentials") && method.equals("GET")) {
            sendJson(ex, 200, devices.credentials(uuid(parts[2])));
            return;
        }
        throw ApiException.notFound();
    }

    private void deviceApi(HttpExchange ex, DeviceService devices, TbQueue queue, String token, String kind) throws Exception {
        DeviceService.DeviceInfo device;
        try {
            device = devices.findByToken(token);
        } catch (DeviceLookup.LookupFailed e) {
            Metrics.REGISTRY_REFUSED.labelValues("http").inc();
            if (kind.equals("telemetry")) { // received and refused: counted like an MQTT message refused for the same reason
                Metrics.RECEIVED.inc();
                Metrics.ERRORS.inc();
            }
            throw new ApiException(503, ApiException.GENERAL, e.getMessage());
        }
        if (device == null) {
            send(ex, 401, null, new byte[0]);
            return;
        }
        byte[] body = readBody(ex);
        if (kind.equals("attributes")) {
            send(ex, 200, null, new byte[0]); // accepted and ignored
            return;
        }
        if (!kind.equals("telemetry")) throw ApiException.notFound();
        Metrics.RECEIVED.inc();
        TbMsg msg;
        try {
            msg = TelemetryParser.toMsg(device, new String(body, StandardCharsets.UTF_8), System.currentTimeMillis());
        } catch (TelemetryParser.InvalidPayload e) {
            Metrics.ERRORS.inc();
            badPayloadLog.warn("invalid telemetry from device " + device.name + " (HTTP): " + e.getMessage());
            send(ex, 400, "text/plain", e.getMessage().getBytes(StandardCharsets.UTF_8));
            return;
        }
        CompletableFuture<Void> done = new CompletableFuture<>();
        queue.enqueue(msg, new TbQueue.Callback() {
            @Override
            public void onSuccess() {
                Metrics.ACKED.inc();
                done.complete(null);
            }

            @Override
            public void onFailure(Throwable t) {
                done.completeExceptionally(t);
            }
        });
        try {
            done.get(60, TimeUnit.SECONDS);
        } catch (Exception e) {
            send(ex, 500, "text/plain", ("queue error: " + e.getMessage()).getBytes(StandardCharsets.UTF_8));
            return;
        }
        send(ex, 200, null, new byte[0]);
    }

    private void sendPair(HttpExchange ex, String user) throws IOException {
        String[] pair = jwt.issuePair(user);
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.put("token", pair[0]);
        n.put("refreshToken", pair[1]);
        n.putNull("scope");
        sendJson(ex, 200, n);
    }

    // ---------------------------------------------------------------- helpers

    private static UUID uuid(String s) {
        try {
            return UUID.fromString(s);
        } catch (IllegalArgumentException e) {
            throw ApiException.badRequest("Invalid UUID string: " + s);
        }
    }

    private static int intParam(Map<String, String> q, String name, int def) {
        String v = q.get(name);
        if (v == null || v.isEmpty()) return def;
        try {
            return Integer.parseInt(v);
        } catch (NumberFormatException e) {
            throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Invalid request parameter '" + name + "'");
        }
    }

    private static Map<String, String> parseQuery(String raw) {
        Map<String, String> q = new HashMap<>();
        if (raw == null || raw.isEmpty()) return q;
        for (String kv : raw.split("&")) {
            int i = kv.indexOf('=');
            String k = URLDecoder.decode(i < 0 ? kv : kv.substring(0, i), StandardCharsets.UTF_8);
            String v = i < 0 ? "" : URLDecoder.decode(kv.substring(i + 1), StandardCharsets.UTF_8);
            q.putIfAbsent(k, v);
        }
        return q;
    }

    private static byte[] readBody(HttpExchange ex) throws IOException {
        try (InputStream in = ex.getRequestBody()) {
            byte[] b = in.readNBytes(MAX_BODY + 1);
            if (b.length > MAX_BODY) throw new ApiException(413, ApiException.BAD_REQUEST_PARAMS, "Request body too large");
            return b;
        }
    }

    private static JsonNode readJson(HttpExchange ex) throws IOException {
        JsonNode n = readJsonOrNull(ex);
        if (n == null || !n.isObject()) throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Invalid request body");
        return n;
    }

    private static JsonNode readJsonOrNull(HttpExchange ex) throws IOException {
        byte[] b = readBody(ex);
        if (b.length == 0) return null;
        try {
            return TelemetryParser.MAPPER.readTree(b);
        } catch (IOException e) {
            throw new ApiException(400, ApiException.BAD_REQUEST_PARAMS, "Invalid request body: " + e.getMessage());
        }
    }

    private static void sendError(HttpExchange ex, int status, int code, String message) throws IOException {
        ObjectNode n = TelemetryParser.MAPPER.createObjectNode();
        n.put("status", status);
        n.put("message", message);
        n.put("errorCode", code);
        n.put("timestamp", System.currentTimeMillis());
        sendJson(ex, status, n);
    }

    private static void sendJson(HttpExchange ex, int status, Object body) throws IOException {
        byte[] bytes = body instanceof String s ? s.getBytes(StandardCharsets.UTF_8)
            : TelemetryParser.MAPPER.writeValueAsBytes(body);
        send(ex, status, "application/json", bytes);
    }

    private static void send(HttpExchange ex, int status, String contentType, byte[] body) throws IOException {
        if (contentType != null) ex.getResponseHeaders().set("Content-Type", contentType);
        ex.sendResponseHeaders(status, body.length == 0 ? -1 : body.length);
        if (body.length > 0) {
            try (OutputStream os = ex.getResponseBody()) {
                os.write(body);
            }
        }
    }
}
