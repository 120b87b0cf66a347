package io.monsoon.platform;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.UUID;

/**
 * ThingsBoard's telemetry JSON formats: {"k":v,...}, {"ts":123,"values":{...}}, or a JSON array of
 * either. Integers go to long_v, other numbers to dbl_v, strings to str_v, booleans to bool_v,
 * objects/arrays to json_v. Null values are skipped.
 */
final class TelemetryParser {
    static final ObjectMapper MAPPER = new ObjectMapper();

    static final class InvalidPayload extends Exception {
        InvalidPayload(String message) {
            super(message);
        }
    }

    private TelemetryParser() {
    }

    static List<KvEntry> parse(String json, long defaultTs) throws InvalidPayload {
        JsonNode root;
        try {
            root = MAPPER.readTree(json);
        } catch (JsonProcessingException e) {
            throw new InvalidPayload("invalid JSON: " + e.getOriginalMessage());
        } catch (IOException e) {
            throw new InvalidPayload("invalid JSON: " + e.getMessage());
        }
        if (root == null || root.isMissingNode()) throw new InvalidPayload("empty payload");
        List<KvEntry> out = new ArrayList<>();
        if (root.isArray()) {
            for (JsonNode el : root) {
                if (!el.isObject()) throw new InvalidPayload("array elements must be JSON objects");
                parseObject(el, defaultTs, out);
            }
        } else if (root.isObject()) {
            parseObject(root, defaultTs, out);
        } else {
            throw new InvalidPayload("payload must be a JSON object or array");
        }
        return out;
    }

    private static void parseObject(JsonNode obj, long defaultTs, List<KvEntry> out) throws InvalidPayload {
        JsonNode values = obj.get("values");
        if (obj.has("ts") && values != null) {
            JsonNode tsNode = obj.get("ts");
            long ts;
            if (tsNode.isIntegralNumber() && tsNode.canConvertToLong()) {
                ts = tsNode.asLong();
            } else if (tsNode.isTextual()) {
                try {
                    ts = Long.parseLong(tsNode.asText());
                } catch (NumberFormatException e) {
                    throw new InvalidPayload("'ts' must be an integer (ms)");
                }
            } else {
                throw new InvalidPayload("'ts' must be an integer (ms)");
            }
            if (!values.isObject()) throw new InvalidPayload("'values' must be a JSON object");
            addValues(values, ts, out);
        } else {
            addValues(obj, defaultTs, out);
        }
    }

    private static void addValues(JsonNode obj, long ts, List<KvEntry> out) throws InvalidPayload {
        Iterator<Map.Entry<String, JsonNode>> it = obj.fields();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> f = it.next();
            String key = f.getKey();
            if (key.isEmpty() || key.length() > 255) throw new InvalidPayload("invalid key '" + key + "'");
            JsonNode v = f.getValue();
            if (v.isNull()) continue;
            if (v.isBoolean()) {
                out.add(new KvEntry(key, ts, KvEntry.Type.BOOLEAN, v.booleanValue()));
            } else if (v.isIntegralNumber()) {
                if (v.canConvertToLong()) out.add(new KvEntry(key, ts, KvEntry.Type.LONG, v.longValue()));
                else out.add(new KvEntry(key, ts, KvEntry.Type.DOUBLE, v.doubleValue()));
            } else if (v.isNumber()) {
                out.add(new KvEntry(key, ts, KvEntry.Type.DOUBLE, v.doubleValue()));
            } else if (v.isTextual()) {
                out.add(new KvEntry(key, ts, KvEntry.Type.STRING, v.textValue()));
            } else if (v.isContainerNode()) {
                out.add(new KvEntry(key, ts, KvEntry.Type.JSON, v.toString()));
            } else {
                throw new InvalidPayload("unsupported value for key '" + key + "'");
            }
        }
    }

    /** Builds the queued message (TB's TbMsg shape: metadata map + raw data + parsed entries). */
    static TbMsg toMsg(DeviceService.DeviceInfo device, String json, long serverTs) throws InvalidPayload {
        List<KvEntry> entries = parse(json, serverTs);
        Map<String, String> md = new HashMap<>(8);
        md.put("deviceName", device.name);
        md.put("deviceType", device.type);
        md.put("ts", Long.toString(serverTs));
        return new TbMsg(UUID.randomUUID(), device.id, device.name, device.type, serverTs, json, md, entries);
    }
}
