package io.monsoon.platform;

/** One time-series value: exactly one of the typed fields is meaningful, chosen by {@link #type}. */
final class KvEntry {
    enum Type { BOOLEAN, STRING, LONG, DOUBLE, JSON }

    final String key;
    final long ts;
    final Type type;
    final Object value; // Boolean, String, Long, Double, or String (JSON text)

    KvEntry(String key, long ts, Type type, Object value) {
        this.key = key;
        this.ts = ts;
        this.type = type;
        this.value = value;
    }
}
