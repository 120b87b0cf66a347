package io.monsoon.platform;

import java.util.List;
import java.util.UUID;

/**
 * The device registry: devices and their ACCESS_TOKEN credentials. {@link SqlDeviceStore} keeps them in
 * Postgres (ThingsBoard's tables, the default), {@link MongoDeviceStore} in MongoDB / FerretDB
 * (collections {@code devices} and {@code credentials}), as Eclipse Hono's MongoDB device registry does.
 * Device profiles always stay in Postgres. Errors are thrown as they come ({@link ApiException} for the
 * REST API's 400/404 answers).
 */
interface DeviceStore extends AutoCloseable {
    /** A device as stored. */
    record DeviceRow(UUID id, long createdTime, String name, String type, String label, UUID profileId) {
    }

    /** ACCESS_TOKEN credentials of one device. */
    record CredentialsRow(UUID id, long createdTime, UUID deviceId, String token) {
    }

    /** One page of a listing plus the total number of matches. */
    record Page(List<DeviceRow> rows, long total) {
    }

    /** "sql" or "mongo": the {@code source} label of the lookup metrics. */
    String name();

    // ---- lookups on the device connection / message path (through DeviceLookup's caches)

    /** Device id owning this access token, or null when unknown. */
    UUID deviceIdByToken(String token) throws Exception;

    /** The device, or null when unknown. */
    DeviceRow deviceById(UUID id) throws Exception;

    // ---- the REST provisioning API

    /** Throws {@link ApiException#notFound()} when absent. */
    DeviceRow findByName(String name) throws Exception;

    /** Throws {@link ApiException#notFound()} when absent. */
    DeviceRow get(UUID id) throws Exception;

    /** Ordered by creation time then name; {@code textSearch} is a case-insensitive substring of the name and
     *  {@code type} the device type exactly (each ignored when null or empty): ThingsBoard's device search. */
    Page list(int pageSize, int page, String textSearch, String type) throws Exception;

    /** Creates the device and its credentials; duplicates -> ApiException 400 (TB's messages). */
    void create(DeviceRow device, String token) throws Exception;

    /** Updates name/type/label/profile (and the token when not null); absent -> 404; duplicates -> 400. */
    void update(DeviceRow device, String token) throws Exception;

    /** Deletes the device and its credentials; returns the token it had (null if none); absent -> 404. */
    String delete(UUID id) throws Exception;

    /** Throws {@link ApiException#notFound()} when absent. */
    CredentialsRow credentials(UUID deviceId) throws Exception;

    @Override
    default void close() {
    }
}
