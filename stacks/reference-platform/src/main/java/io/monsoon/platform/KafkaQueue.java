package io.monsoon.platform;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.atomic.LongAdder;

/**
 * TB_QUEUE_TYPE=kafka: every message is produced (key = device id, acks=all) to TB_KAFKA_TOPIC and
 * acked in the send callback. TB_CONSUMER_THREADS consumers of group TB_KAFKA_GROUP write each polled
 * batch to Postgres and only then commitSync its offsets (at-least-once; writes are idempotent upserts).
 */
final class KafkaQueue implements TbQueue {
    private static final Logger log = LoggerFactory.getLogger(KafkaQueue.class);

    private final Config cfg;
    private final TsWriter writer;
    private KafkaProducer<String, byte[]> producer;
    private final List<KafkaConsumer<String, byte[]>> consumers = new CopyOnWriteArrayList<>();
    private final List<Thread> threads = new ArrayList<>();
    private final LongAdder produced = new LongAdder();
    private final LongAdder storedHere = new LongAdder();
    private final AtomicLongArray lag;
    private volatile boolean running = true;
    private volatile boolean started;

    KafkaQueue(Config cfg, TsWriter writer) {
        this.cfg = cfg;
        this.writer = writer;
        this.lag = new AtomicLongArray(cfg.consumerThreads);
    }

    @Override
    public void start() throws Exception {
        ensureTopic();
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, cfg.kafkaServers);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "tb-transport-producer");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 5000);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10000);
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 30000);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        producer = new KafkaProducer<>(p);
        try {
            producer.partitionsFor(cfg.kafkaTopic); // fails fast (max.block.ms) when the broker is unreachable
        } catch (Exception e) {
            throw new IllegalStateException("Kafka producer cannot reach " + cfg.kafkaServers + ": " + e.getMessage(), e);
        }
        CountDownLatch subscribed = new CountDownLatch(cfg.consumerThreads);
        for (int i = 0; i < cfg.consumerThreads; i++) {
            final int idx = i;
            Thread t = new Thread(() -> consume(idx, subscribed), "tb-rule-engine-kafka-consumer-" + i);
            t.setDaemon(true);
            t.start();
            threads.add(t);
        }
        if (!subscribed.await(cfg.startupTimeoutSec, TimeUnit.SECONDS)) {
            throw new IllegalStateException("Kafka consumers did not start within " + cfg.startupTimeoutSec + " s");
        }
        started = true;
        log.info("kafka queue started: servers={} topic={} group={} consumers={} batch={}{}", cfg.kafkaServers,
            cfg.kafkaTopic, cfg.kafkaGroup, cfg.consumerThreads, cfg.consumerBatchSize,
            cfg.kafkaGroupInstanceId == null ? "" : " group.instance.id=" + cfg.kafkaGroupInstanceId);
    }

    /** Creates the topic through the AdminClient if absent; bounded retry, then a clear failure. */
    private void ensureTopic() {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, cfg.kafkaServers);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 5000);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, 5000);
        long deadline = System.nanoTime() + cfg.startupTimeoutSec * 1_000_000_000L;
        Exception last = null;
        try (Admin admin = Admin.create(p)) {
            while (System.nanoTime() < deadline) {
                try {
                    Set<String> names = admin.listTopics().names().get(5, TimeUnit.SECONDS);
                    if (names.contains(cfg.kafkaTopic)) {
                        log.info("kafka topic {} exists", cfg.kafkaTopic);
                        return;
                    }
                    try {
                        admin.createTopics(List.of(new NewTopic(cfg.kafkaTopic, cfg.kafkaPartitions, (short) 1)))
                            .all().get(10, TimeUnit.SECONDS);
                        log.info("kafka topic {} created with {} partition(s)", cfg.kafkaTopic, cfg.kafkaPartitions);
                    } catch (ExecutionException e) {
                        if (!(e.getCause() instanceof TopicExistsException)) throw e;
                    }
                    return;
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for Kafka", e);
                } catch (Exception e) {
                    last = e;
                    log.warn("Kafka not ready at {} ({}); retrying", cfg.kafkaServers, e.toString());
                    Db.sleep(1000);
                }
            }
        }
        throw new IllegalStateException("cannot reach Kafka at " + cfg.kafkaServers + " within " + cfg.startupTimeoutSec
            + " s: " + (last == null ? "timeout" : last.toString()), last);
    }

    @Override
    public void enqueue(TbMsg msg, Callback callback) {
        ObjectNode v = TelemetryParser.MAPPER.createObjectNode();
        v.put("id", msg.id.toString());
        v.put("d", msg.deviceId.toString());
        v.put("n", msg.deviceName);
        v.put("t", msg.deviceType);
        v.put("ts", msg.serverTs);
        v.put("p", msg.data);
        byte[] bytes;
        try {
            bytes = TelemetryParser.MAPPER.writeValueAsBytes(v);
            producer.send(new ProducerRecord<>(cfg.kafkaTopic, msg.deviceId.toString(), bytes), (md, ex) -> {
                if (ex == null) {
                    produced.increment();
                    callback.onSuccess();
                } else {
                    Metrics.ERRORS.inc();
                    callback.onFailure(ex);
                }
            });
        } catch (Exception e) {
            Metrics.ERRORS.inc();
            callback.onFailure(e);
        }
    }

    private static TbMsg decode(byte[] value) throws Exception {
        JsonNode v = TelemetryParser.MAPPER.readTree(value);
        DeviceService.DeviceInfo dev = new DeviceService.DeviceInfo(
            UUID.fromString(v.get("d").asText()), v.path("n").asText(), v.path("t").asText());
        return TelemetryParser.toMsg(dev, v.get("p").asText(), v.get("ts").asLong());
    }

    private void consume(int idx, CountDownLatch subscribed) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, cfg.kafkaServers);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, cfg.kafkaGroup);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "tb-rule-engine-consumer-" + idx);
        if (cfg.kafkaGroupInstanceId != null) {
            p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG,
                cfg.consumerThreads == 1 ? cfg.kafkaGroupInstanceId : cfg.kafkaGroupInstanceId + "-" + idx);
        }
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10000);
        p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 3000);
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, cfg.consumerBatchSize);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        KafkaConsumer<String, byte[]> c;
        try {
            c = new KafkaConsumer<>(p);
        } catch (Exception e) {
            log.error("cannot create Kafka consumer {}: {}", idx, e.toString());
            return; // start() times out and fails the platform
        }
        consumers.add(c);
        try (c) {
            c.subscribe(List.of(cfg.kafkaTopic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                    if (!parts.isEmpty()) log.info("consumer {} revoked {}", idx, parts);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    log.info("consumer {} assigned {}", idx, parts);
                }
            });
            subscribed.countDown();
            long backoff = 100;
            BrokerWatch watch = cfg.defects.stallAfterBrokerRestart ? new BrokerWatch(idx) : null;
            while (running) {
                ConsumerRecords<String, byte[]> recs;
                try {
                    recs = c.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                updateLag(idx, c);
                if (watch != null && watch.stalled(c, !recs.isEmpty())) {
                    // DEFECT_STALL_AFTER_BROKER_RESTART: "wait until the broker is back" - and never resume.
                    // Whatever is assigned (again, after a rebalance) is paused; polling goes on (the member
                    // stays in the group and /health stays UP), nothing is consumed or committed any more.
                    c.pause(c.assignment());
                    continue;
                }
                if (recs.isEmpty()) continue;
                List<TbMsg> msgs = new ArrayList<>(recs.count());
                for (ConsumerRecord<String, byte[]> r : recs) {
                    try {
                        msgs.add(decode(r.value()));
                    } catch (Exception e) {
                        Metrics.ERRORS.inc();
                        log.warn("skipping undecodable record {}-{}@{}: {}", r.topic(), r.partition(), r.offset(), e.toString());
                    }
                }
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (TopicPartition tp : recs.partitions()) {
                    List<ConsumerRecord<String, byte[]>> l = recs.records(tp);
                    offsets.put(tp, new OffsetAndMetadata(l.get(l.size() - 1).offset() + 1));
                }
                if (cfg.defects.commitBeforeWrite) {
                    // DEFECT_COMMIT_BEFORE_WRITE: the offsets are committed first; a crash before the write
                    // below completes loses the batch (the restarted consumer starts after it).
                    try {
                        c.commitSync(offsets);
                    } catch (CommitFailedException | RebalanceInProgressException e) {
                        log.warn("offset commit failed ({})", e.toString());
                    }
                }
                try {
                    writer.write(msgs);
                } catch (Exception e) {
                    Metrics.ERRORS.inc(msgs.size());
                    log.warn("storing a batch of {} failed ({}); not committing, seeking back, retry in {} ms",
                        msgs.size(), e.getMessage(), backoff);
                    for (TopicPartition tp : recs.partitions()) c.seek(tp, recs.records(tp).get(0).offset());
                    Db.sleep(backoff);
                    backoff = Math.min(backoff * 2, 5000);
                    continue;
                }
                backoff = 100;
                Metrics.STORED.inc(msgs.size());
                storedHere.add(msgs.size());
                if (cfg.defects.commitBeforeWrite) continue; // committed above, before the write
                try {
                    c.commitSync(offsets);
                } catch (CommitFailedException | RebalanceInProgressException e) {
                    log.warn("offset commit failed ({}); the batch will be redelivered (idempotent upserts)", e.toString());
                } catch (WakeupException e) {
                    c.commitSync(offsets);
                    break;
                }
            }
        } catch (Exception e) {
            if (running) log.error("Kafka consumer {} stopped: {}", idx, e.toString(), e);
        } finally {
            consumers.remove(c);
        }
    }

    /**
     * DEFECT_STALL_AFTER_BROKER_RESTART: once the consumer is consuming, a closed broker connection (its own
     * {@code connection-close-total} metric going up: the broker went away) makes it pause its partitions "until
     * the broker is back" - and the resume was never written, so it reports "stalled" forever after.
     */
    private static final class BrokerWatch {
        private final int idx;
        private double baseline = -1; // connection closes seen when consumption started
        private boolean stalled;

        BrokerWatch(int idx) {
            this.idx = idx;
        }

        boolean stalled(KafkaConsumer<String, byte[]> c, boolean gotRecords) {
            if (stalled) return true;
            double closed = metric(c, "connection-close-total");
            if (closed < 0) return false;
            if (baseline < 0) {
                if (gotRecords) baseline = closed; // consuming normally from here on
                return false;
            }
            if (closed > baseline) {
                stalled = true;
                log.warn("DEFECT_STALL_AFTER_BROKER_RESTART: consumer {} lost a broker connection; pausing its "
                    + "partitions until the broker is back (they are never resumed)", idx);
            }
            return stalled;
        }

        private static double metric(KafkaConsumer<String, byte[]> c, String name) {
            for (Map.Entry<org.apache.kafka.common.MetricName, ? extends org.apache.kafka.common.Metric> e
                : c.metrics().entrySet()) {
                org.apache.kafka.common.MetricName m = e.getKey();
                if (m.name().equals(name) && m.group().equals("consumer-metrics")) {
                    Object v = e.getValue().metricValue();
                    return v instanceof Number num ? num.doubleValue() : -1;
                }
            }
            return -1;
        }
    }

    private void updateLag(int idx, KafkaConsumer<String, byte[]> c) {
        long sum = 0;
        for (TopicPartition tp : c.assignment()) {
            sum += c.currentLag(tp).orElse(0);
        }
        lag.set(idx, sum);
    }

    double consumerLag() {
        long sum = 0;
        for (int i = 0; i < lag.length(); i++) sum += lag.get(i);
        return sum;
    }

    @Override
    public long size() {
        return Math.max(0, produced.sum() - storedHere.sum());
    }

    @Override
    public boolean ready() {
        return started && !consumers.isEmpty();
    }

    @Override
    public void stop() {
        running = false;
        for (KafkaConsumer<String, byte[]> c : consumers) c.wakeup();
        for (Thread t : threads) {
            try {
                t.join(5000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if (producer != null) producer.close(Duration.ofSeconds(5));
    }
}
