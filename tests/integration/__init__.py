"""monsoon's integration tests: real Kafka, Postgres, Toxiproxy, the reference platform."""
