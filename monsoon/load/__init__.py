"""Load: shapes, the open-model schedule, payloads, per-second stats and the fleets (MQTT, HTTP, CoAP, native)."""
