package io.monsoon.platform;

import com.mongodb.ConnectionString;
import com.mongodb.ErrorCategory;
import com.mongodb.MongoClientSettings;
import com.mongodb.MongoWriteException;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoClients;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoDatabase;
import com.mongodb.client.model.Filters;
import com.mongodb.client.model.IndexOptions;
import com.mongodb.client.model.Indexes;
import com.mongodb.client.model.Sorts;
import com.mongodb.client.model.Updates;
import com.mongodb.client.result.UpdateResult;
import org.bson.Document;
import org.bson.conversions.Bson;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;

/**
 * The Hono-style registry (REGISTRY_TYPE=mongo) on MongoDB or FerretDB (no transactions, no change streams used).
 * <pre>
 * devices:     {_id: "uuid", createdTime, name (unique), type, label, deviceProfileId: "uuid"|null, tenantId}
 * credentials: {_id: "uuid", createdTime, deviceId: "uuid" (unique), type: "ACCESS_TOKEN", authId: token (unique)}
 * </pre>
 * Every device is also mirrored as a Postgres {@code device} row (the storage-side entity: telemetry stays in
 * Postgres and the loss query joins {@code ts_kv} with {@code device}). Without transactions, a multi-step
 * write undoes its earlier steps when a later one fails.
 */
final class MongoDeviceStore implements DeviceStore {
    private static final Logger log = LoggerFactory.getLogger(MongoDeviceStore.class);
    static final String DEVICES = "devices";
    static final String CREDENTIALS = "credentials";

    private final String url;
    private final MongoClient client;
    private final MongoCollection<Document> devices;
    private final MongoCollection<Document> credentials;
    private final SqlDeviceStore mirror;
    private final UUID tenantId;

    MongoDeviceStore(Config cfg, SqlDeviceStore mirror, UUID tenantId) {
        this.url = cfg.mongoUrl;
        this.mirror = mirror;
        this.tenantId = tenantId;
        ConnectionString cs = new ConnectionString(cfg.mongoUrl);
        int readTimeout = (int) Math.min(Integer.MAX_VALUE, Math.max(cfg.registryTimeoutMs, 1000));
        MongoClientSettings settings = MongoClientSettings.builder()
            .applicationName("reference-platform")
            .retryWrites(false) // FerretDB has no transactions / txnNumber
            .applyToClusterSettings(b -> b.serverSelectionTimeout(2000, TimeUnit.MILLISECONDS))
            .applyToSocketSettings(b -> b.connectTimeout(2000, TimeUnit.MILLISECONDS)
                .readTimeout(readTimeout, TimeUnit.MILLISECONDS))
            .applyToConnectionPoolSettings(b -> b.maxSize(Math.max(cfg.registryLookupThreads, 16))
                .maxWaitTime(readTimeout, TimeUnit.MILLISECONDS))
            .applyConnectionString(cs) // options in MONGO_URL win
            .build();
        client = MongoClients.create(settings);
        MongoDatabase db = client.getDatabase(cs.getDatabase() == null ? "monsoon" : cs.getDatabase());
        devices = db.getCollection(DEVICES);
        credentials = db.getCollection(CREDENTIALS);
    }

    /** Bounded wait for the server at startup, then the unique indexes; throws with a clear message. */
    void start(int timeoutSec) {
        long deadline = System.nanoTime() + timeoutSec * 1_000_000_000L;
        RuntimeException last;
        int attempt = 0;
        while (true) {
            attempt++;
            try {
                client.getDatabase(devices.getNamespace().getDatabaseName()).runCommand(new Document("ping", 1));
                if (attempt > 1) log.info("Mongo registry reachable after {} attempts", attempt);
                break;
            } catch (RuntimeException e) {
                last = e;
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("cannot reach the Mongo registry at " + redacted() + " within "
                        + timeoutSec + " s: " + firstLine(e), e);
                }
                if (attempt == 1 || attempt % 5 == 0) {
                    log.warn("Mongo registry not reachable at {} yet ({}); retrying", redacted(), firstLine(e));
                }
                Db.sleep(500);
            }
        }
        devices.createIndex(Indexes.ascending("name"), new IndexOptions().unique(true).name("name_unique"));
        credentials.createIndex(Indexes.ascending("authId"), new IndexOptions().unique(true).name("auth_id_unique"));
        credentials.createIndex(Indexes.ascending("deviceId"), new IndexOptions().unique(true).name("device_id_unique"));
        log.info("Mongo registry ready at {} (collections {}, {})", redacted(), DEVICES, CREDENTIALS);
    }

    @Override
    public String name() {
        return "mongo";
    }

    @Override
    public UUID deviceIdByToken(String token) {
        Document d = credentials.find(Filters.and(Filters.eq("authId", token), Filters.eq("type", "ACCESS_TOKEN")))
            .projection(new Document("deviceId", 1)).first();
        return d == null ? null : UUID.fromString(d.getString("deviceId"));
    }

    @Override
    public DeviceRow deviceById(UUID id) {
        Document d = devices.find(Filters.eq("_id", id.toString())).first();
        return d == null ? null : row(d);
    }

    @Override
    public DeviceRow findByName(String name) {
        Document d = devices.find(Filters.eq("name", name)).first();
        if (d == null) throw ApiException.notFound();
        return row(d);
    }

    @Override
    public DeviceRow get(UUID id) {
        DeviceRow r = deviceById(id);
        if (r == null) throw ApiException.notFound();
        return r;
    }

    @Override
    public Page list(int pageSize, int page, String textSearch, String type) {
        Bson filter = filter(textSearch, type);
        long total = devices.countDocuments(filter);
        List<DeviceRow> rows = new ArrayList<>();
        for (Document d : devices.find(filter).sort(Sorts.ascending("createdTime", "name"))
            .skip((int) Math.min(Integer.MAX_VALUE, (long) page * pageSize)).limit(pageSize)) {
            rows.add(row(d));
        }
        return new Page(rows, total);
    }

    /** The search's filter: the name's case-insensitive substring and the exact type, each when given. */
    static Bson filter(String textSearch, String type) {
        List<Bson> and = new ArrayList<>();
        if (textSearch != null && !textSearch.isEmpty()) and.add(Filters.regex("name", Pattern.quote(textSearch), "i"));
        if (type != null && !type.isEmpty()) and.add(Filters.eq("type", type));
        return and.isEmpty() ? new Document() : and.size() == 1 ? and.get(0) : Filters.and(and);
    }

    @Override
    public void create(DeviceRow d, String token) throws Exception {
        try {
            devices.insertOne(doc(d));
        } catch (MongoWriteException e) {
            if (duplicate(e)) throw ApiException.badRequest("Device with such name already exists!");
            throw e;
        }
        try {
            credentials.insertOne(new Document("_id", UUID.randomUUID().toString())
                .append("createdTime", System.currentTimeMillis())
                .append("deviceId", d.id().toString())
                .append("type", "ACCESS_TOKEN")
                .append("authId", token));
            mirror.mirrorUpsert(d);
        } catch (Exception e) {
            undo(() -> credentials.deleteMany(Filters.eq("deviceId", d.id().toString())));
            undo(() -> devices.deleteOne(Filters.eq("_id", d.id().toString())));
            if (e instanceof MongoWriteException mwe && duplicate(mwe)) {
                throw ApiException.badRequest("Specified credentials are already registered!");
            }
            throw e;
        }
    }

    @Override
    public void update(DeviceRow d, String token) throws Exception {
        UpdateResult r;
        try {
            r = devices.updateOne(Filters.eq("_id", d.id().toString()), Updates.combine(
                Updates.set("name", d.name()), Updates.set("type", d.type()), Updates.set("label", d.label()),
                Updates.set("deviceProfileId", d.profileId() == null ? null : d.profileId().toString())));
        } catch (MongoWriteException e) {
            if (duplicate(e)) throw ApiException.badRequest("Device with such name already exists!");
            throw e;
        }
        if (r.getMatchedCount() == 0) throw ApiException.notFound();
        if (token != null && !token.isEmpty()) {
            try {
                credentials.updateOne(Filters.eq("deviceId", d.id().toString()), Updates.set("authId", token));
            } catch (MongoWriteException e) {
                if (duplicate(e)) throw ApiException.badRequest("Specified credentials are already registered!");
                throw e;
            }
        }
        mirror.mirrorUpsert(get(d.id()));
    }

    @Override
    public String delete(UUID id) throws Exception {
        Document cred = credentials.find(Filters.eq("deviceId", id.toString())).first();
        long n = devices.deleteOne(Filters.eq("_id", id.toString())).getDeletedCount();
        credentials.deleteMany(Filters.eq("deviceId", id.toString()));
        mirror.mirrorDelete(id);
        if (n == 0) throw ApiException.notFound();
        return cred == null ? null : cred.getString("authId");
    }

    @Override
    public CredentialsRow credentials(UUID deviceId) {
        Document d = credentials.find(Filters.eq("deviceId", deviceId.toString())).first();
        if (d == null) throw ApiException.notFound();
        return new CredentialsRow(UUID.fromString(d.getString("_id")), number(d, "createdTime"), deviceId,
            d.getString("authId"));
    }

    @Override
    public void close() {
        client.close();
    }

    // ---------------------------------------------------------------- helpers

    private Document doc(DeviceRow d) {
        return new Document("_id", d.id().toString())
            .append("createdTime", d.createdTime())
            .append("name", d.name())
            .append("type", d.type())
            .append("label", d.label())
            .append("deviceProfileId", d.profileId() == null ? null : d.profileId().toString())
            .append("tenantId", tenantId.toString());
    }

    private static DeviceRow row(Document d) {
        String profile = d.getString("deviceProfileId");
        return new DeviceRow(UUID.fromString(d.getString("_id")), number(d, "createdTime"), d.getString("name"),
            d.getString("type"), d.getString("label"), profile == null ? null : UUID.fromString(profile));
    }

    private static long number(Document d, String field) {
        Object v = d.get(field);
        return v instanceof Number n ? n.longValue() : 0L;
    }

    private static boolean duplicate(MongoWriteException e) {
        return e.getError().getCategory() == ErrorCategory.DUPLICATE_KEY || e.getError().getCode() == 11000;
    }

    private static void undo(Runnable r) {
        try {
            r.run();
        } catch (RuntimeException e) {
            log.warn("Mongo registry: could not undo a partial write: {}", firstLine(e));
        }
    }

    private String redacted() {
        return url.replaceAll("//[^@/]*@", "//***@");
    }

    static String firstLine(Throwable e) {
        String m = e.getMessage() == null ? e.toString() : e.getMessage();
        int nl = m.indexOf('\n');
        if (nl >= 0) m = m.substring(0, nl);
        int view = m.indexOf(". Client view of cluster state"); // the Mongo driver's server-selection dump
        return view < 0 ? m : m.substring(0, view);
    }
}
