package io.monsoon.platform;

import java.util.List;
import java.util.Map;
import java.util.UUID;

/**
 * A queued telemetry message, shaped like ThingsBoard's TbMsg: originator, metadata, the raw JSON
 * payload and the parsed key/values. Kept deliberately "fat" (raw text + parsed form + metadata,
 * roughly 1 KB on the heap) because that is what makes an unbounded in-memory queue fill the heap.
 */
final class TbMsg {
    final UUID id;
    final UUID deviceId;
    final String deviceName;
    final String deviceType;
    final long serverTs;
    final String data;
    final Map<String, String> metadata;
    final List<KvEntry> entries;

    TbMsg(UUID id, UUID deviceId, String deviceName, String deviceType, long serverTs, String data,
          Map<String, String> metadata, List<KvEntry> entries) {
        this.id = id;
        this.deviceId = deviceId;
        this.deviceName = deviceName;
        this.deviceType = deviceType;
        this.serverTs = serverTs;
        this.data = data;
        this.metadata = metadata;
        this.entries = entries;
    }
}
