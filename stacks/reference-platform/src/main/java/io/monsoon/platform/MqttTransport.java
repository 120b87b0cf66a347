package io.monsoon.platform;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.netty.handler.codec.DecoderException;
import io.netty.handler.codec.mqtt.MqttConnAckMessage;
import io.netty.handler.codec.mqtt.MqttConnectMessage;
import io.netty.handler.codec.mqtt.MqttConnectReturnCode;
import io.netty.handler.codec.mqtt.MqttDecoder;
import io.netty.handler.codec.mqtt.MqttEncoder;
import io.netty.handler.codec.mqtt.MqttFixedHeader;
import io.netty.handler.codec.mqtt.MqttIdentifierRejectedException;
import io.netty.handler.codec.mqtt.MqttMessage;
import io.netty.handler.codec.mqtt.MqttMessageBuilders;
import io.netty.handler.codec.mqtt.MqttMessageIdVariableHeader;
import io.netty.handler.codec.mqtt.MqttMessageType;
import io.netty.handler.codec.mqtt.MqttPublishMessage;
import io.netty.handler.codec.mqtt.MqttQoS;
import io.netty.handler.codec.mqtt.MqttSubAckMessage;
import io.netty.handler.codec.mqtt.MqttSubAckPayload;
import io.netty.handler.codec.mqtt.MqttSubscribeMessage;
import io.netty.handler.codec.mqtt.MqttTopicSubscription;
import io.netty.handler.codec.mqtt.MqttUnacceptableProtocolVersionException;
import io.netty.handler.codec.mqtt.MqttUnsubscribeMessage;
import io.netty.handler.flush.FlushConsolidationHandler;
import io.netty.handler.timeout.IdleStateEvent;
import io.netty.handler.timeout.IdleStateHandler;
import io.netty.util.ReferenceCountUtil;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;

/** The MQTT device API (MQTT 3.1 / 3.1.1, username = access token), on Netty's MQTT codec. */
final class MqttTransport {
    private static final Logger log = LoggerFactory.getLogger(MqttTransport.class);
    static final String TELEMETRY_TOPIC = "v1/devices/me/telemetry";
    private static final int MAX_PAYLOAD = 65536;
    private static final int CONNECT_TIMEOUT_SEC = 10;

    private final Config cfg;
    private final DeviceService devices;
    private final TbQueue queue;
    private EventLoopGroup boss;
    private EventLoopGroup workers;
    private Channel serverChannel;

    MqttTransport(Config cfg, DeviceService devices, TbQueue queue) {
        this.cfg = cfg;
        this.devices = devices;
        this.queue = queue;
    }

    void start() throws InterruptedException {
        boss = new NioEventLoopGroup(1);
        workers = new NioEventLoopGroup(Math.max(2, Runtime.getRuntime().availableProcessors()));
        ServerBootstrap b = new ServerBootstrap()
            .group(boss, workers)
            .channel(NioServerSocketChannel.class)
            .option(ChannelOption.SO_BACKLOG, 1024)
            .childOption(ChannelOption.TCP_NODELAY, true)
            .childHandler(new ChannelInitializer<SocketChannel>() {
                @Override
                protected void initChannel(SocketChannel ch) {
                    ch.pipeline()
                        .addLast("flush", new FlushConsolidationHandler(256, true))
                        .addLast("decoder", new MqttDecoder(MAX_PAYLOAD))
                        .addLast("encoder", MqttEncoder.INSTANCE)
                        .addLast("idle", new IdleStateHandler(CONNECT_TIMEOUT_SEC, 0, 0))
                        .addLast("handler", new Session());
                }
            });
        try {
            serverChannel = b.bind(new InetSocketAddress(cfg.mqttHost, cfg.mqttPort)).sync().channel();
        } catch (Exception e) {
            throw new IllegalStateException("cannot bind MQTT to " + cfg.mqttHost + ":" + cfg.mqttPort + ": " + e, e);
        }
        log.info("MQTT transport listening on {}:{}", cfg.mqttHost, cfg.mqttPort);
    }

    boolean listening() {
        return serverChannel != null && serverChannel.isActive();
    }

    void stop() {
        if (serverChannel != null) serverChannel.close().awaitUninterruptibly(2000);
        if (workers != null) workers.shutdownGracefully(0, 2, TimeUnit.SECONDS);
        if (boss != null) boss.shutdownGracefully(0, 2, TimeUnit.SECONDS);
    }

    private static final RateLimitedLog BAD_PAYLOAD_LOG = new RateLimitedLog(log, 1000);
    private static final RateLimitedLog LOOKUP_LOG = new RateLimitedLog(log, 5000);
    /** Messages read while a lookup is in flight, beyond which the connection is closed. */
    private static final int MAX_PENDING = 1000;

    /**
     * One device connection. Device lookups (CONNECT: token -> device; every PUBLISH: the device, through
     * the near cache) block this connection, not the event loop: on a near-cache miss, reading stops
     * (autoRead off), the lookup runs on the registry pool, and everything decoded meanwhile waits in
     * {@code pending}, replayed in order once the lookup returns; so per-device order is kept and a slow
     * registry/cache delays this device's messages and PUBACKs as a synchronous adapter would. All state is
     * touched on the channel's event loop only.
     */
    private final class Session extends ChannelInboundHandlerAdapter {
        private volatile DeviceService.DeviceInfo device;
        private boolean connectSeen;
        /** A lookup is in flight: reading is paused and messages wait in {@link #pending}. */
        private boolean busy;
        private final ArrayDeque<MqttMessage> pending = new ArrayDeque<>();

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            if (!(msg instanceof MqttMessage m)) {
                ReferenceCountUtil.release(msg);
                return;
            }
            if (busy) {
                if (pending.size() < MAX_PENDING) {
                    pending.add(m); // keeps the reference; released once processed
                } else {
                    ReferenceCountUtil.release(m);
                    ctx.close();
                }
                return;
            }
            try {
                process(ctx, m);
            } finally {
                ReferenceCountUtil.release(m);
            }
        }

        /** Stops reading until {@link #resume} (a lookup is in flight). */
        private void pause(ChannelHandlerContext ctx) {
            busy = true;
            ctx.channel().config().setAutoRead(false);
        }

        /** Replays what arrived during the lookup, in order, then reads again (unless another lookup started). */
        private void resume(ChannelHandlerContext ctx) {
            busy = false;
            while (!busy && !pending.isEmpty() && ctx.channel().isOpen()) {
                MqttMessage p = pending.poll();
                try {
                    process(ctx, p);
                } finally {
                    ReferenceCountUtil.release(p);
                }
            }
            if (!busy && ctx.channel().isOpen()) ctx.channel().config().setAutoRead(true);
        }

        private void process(ChannelHandlerContext ctx, MqttMessage m) {
            if (m.decoderResult().isFailure()) {
                onDecodeFailure(ctx, m);
                return;
            }
            MqttMessageType type = m.fixedHeader().messageType();
            if (type != MqttMessageType.CONNECT && device == null) {
                ctx.close(); // nothing but CONNECT before the session is authenticated
                return;
            }
            switch (type) {
                case CONNECT -> onConnect(ctx, (MqttConnectMessage) m);
                case PUBLISH -> onPublish(ctx, (MqttPublishMessage) m);
                case PINGREQ -> ctx.writeAndFlush(new MqttMessage(
                    new MqttFixedHeader(MqttMessageType.PINGRESP, false, MqttQoS.AT_MOST_ONCE, false, 0)));
                case DISCONNECT -> ctx.close();
                case SUBSCRIBE -> onSubscribe(ctx, (MqttSubscribeMessage) m);
                case UNSUBSCRIBE -> ctx.writeAndFlush(MqttMessageBuilders.unsubAck()
                    .packetId(((MqttUnsubscribeMessage) m).variableHeader().messageId()).build());
                case PUBREL -> ctx.writeAndFlush(new MqttMessage(
                    new MqttFixedHeader(MqttMessageType.PUBCOMP, false, MqttQoS.AT_MOST_ONCE, false, 0),
                    m.variableHeader()));
                default -> {
                    // PUBACK/PUBREC/PUBCOMP from the device: nothing is ever sent to it with QoS > 0
                }
            }
        }

        private void onDecodeFailure(ChannelHandlerContext ctx, MqttMessage m) {
            Throwable cause = m.decoderResult().cause();
            if (cause instanceof MqttUnacceptableProtocolVersionException) {
                connAck(ctx, MqttConnectReturnCode.CONNECTION_REFUSED_UNACCEPTABLE_PROTOCOL_VERSION)
                    .addListener(ChannelFutureListener.CLOSE);
            } else if (cause instanceof MqttIdentifierRejectedException) {
                connAck(ctx, MqttConnectReturnCode.CONNECTION_REFUSED_IDENTIFIER_REJECTED)
                    .addListener(ChannelFutureListener.CLOSE);
            } else {
                if (cause instanceof DecoderException && cause.getMessage() != null && cause.getMessage().contains("too large")) {
                    Metrics.ERRORS.inc();
                }
                log.debug("closing {}: undecodable MQTT message: {}", ctx.channel().remoteAddress(), cause.toString());
                ctx.close();
            }
        }

        private io.netty.channel.ChannelFuture connAck(ChannelHandlerContext ctx, MqttConnectReturnCode code) {
            MqttConnAckMessage ack = MqttMessageBuilders.connAck().returnCode(code).sessionPresent(false).build();
            return ctx.writeAndFlush(ack);
        }

        private void onConnect(ChannelHandlerContext ctx, MqttConnectMessage m) {
            if (connectSeen) { // a second CONNECT is a protocol violation
                ctx.close();
                return;
            }
            connectSeen = true;
            int level = m.variableHeader().version();
            if (level != 3 && level != 4) {
                connAck(ctx, MqttConnectReturnCode.CONNECTION_REFUSED_UNACCEPTABLE_PROTOCOL_VERSION)
                    .addListener(ChannelFutureListener.CLOSE);
                return;
            }
            String token = m.payload().userName();
            int keepAlive = m.variableHeader().keepAliveTimeSeconds();
            Channel ch = ctx.channel();
            pause(ctx); // nothing else is processed until the token is checked
            devices.lookup().byToken(token).whenComplete((info, err) -> ch.eventLoop().execute(() -> {
                if (!ch.isOpen()) return;
                if (err != null) {
                    Metrics.REGISTRY_REFUSED.labelValues("connect").inc();
                    LOOKUP_LOG.warn("refusing MQTT connection from " + ch.remoteAddress() + ": "
                        + DeviceLookup.failure(err).getMessage());
                    connAck(ctx, MqttConnectReturnCode.CONNECTION_REFUSED_SERVER_UNAVAILABLE)
                        .addListener(ChannelFutureListener.CLOSE);
                    return;
                }
                if (info == null) {
                    log.debug("refusing MQTT connection from {}: unknown access token", ch.remoteAddress());
                    connAck(ctx, MqttConnectReturnCode.CONNECTION_REFUSED_NOT_AUTHORIZED)
                        .addListener(ChannelFutureListener.CLOSE);
                    return;
                }
                device = info;
                ctx.pipeline().remove("idle");
                if (keepAlive > 0) {
                    ctx.pipeline().addBefore("handler", "idle",
                        new IdleStateHandler(keepAlive * 1500L, 0, 0, TimeUnit.MILLISECONDS));
                }
                devices.registerSession(info.id, ch);
                cfg.defects.sessionStarted(info.name); // DEFECT_LEAK_THREAD_PER_RECONNECT: never stopped
                connAck(ctx, MqttConnectReturnCode.CONNECTION_ACCEPTED);
                resume(ctx);
            }));
        }

        /**
         * Every PUBLISH looks its device up (as a Hono adapter asserts the device's registration per message):
         * a near-cache hit goes on at once; a miss pauses this connection until the lookup returns. A failed
         * or timed-out lookup refuses the message (no PUBACK, counted in tb_messages_errors_total) and closes
         * the connection, as does a device deleted meanwhile.
         */
        private void onPublish(ChannelHandlerContext ctx, MqttPublishMessage m) {
            boolean telemetry = TELEMETRY_TOPIC.equals(m.variableHeader().topicName());
            if (telemetry) Metrics.RECEIVED.inc();
            DeviceService.DeviceInfo d = devices.lookup().nearDevice(device.id);
            if (d != null) {
                device = d;
                handlePublish(ctx, m, telemetry);
                return;
            }
            Channel ch = ctx.channel();
            UUID id = device.id;
            pause(ctx);
            m.retain();
            devices.lookup().loadDevice(id).whenComplete((info, err) -> ch.eventLoop().execute(() -> {
                try {
                    if (!ch.isOpen()) return;
                    if (err != null) {
                        if (telemetry) Metrics.ERRORS.inc();
                        Metrics.REGISTRY_REFUSED.labelValues("message").inc();
                        LOOKUP_LOG.warn("refusing a message from " + device.name + " and closing its connection: "
                            + DeviceLookup.failure(err).getMessage());
                        ctx.close();
                        return;
                    }
                    if (info == null) {
                        log.debug("closing the MQTT connection of device {}: it no longer exists", id);
                        ctx.close();
                        return;
                    }
                    device = info;
                    handlePublish(ctx, m, telemetry);
                } finally {
                    m.release();
                }
                resume(ctx);
            }));
        }

        private void handlePublish(ChannelHandlerContext ctx, MqttPublishMessage m, boolean telemetry) {
            MqttQoS qos = m.fixedHeader().qosLevel();
            int packetId = m.variableHeader().packetId();
            Channel ch = ctx.channel();
            if (!telemetry) {
                ack(ch, qos, packetId); // other topics (attributes, rpc, claim...) are accepted and ignored
                return;
            }
            DeviceService.DeviceInfo device = this.device;
            ByteBuf buf = m.payload();
            String json = buf.toString(StandardCharsets.UTF_8);
            TbMsg msg;
            try {
                msg = TelemetryParser.toMsg(device, json, System.currentTimeMillis());
            } catch (TelemetryParser.InvalidPayload e) {
                Metrics.ERRORS.inc();
                BAD_PAYLOAD_LOG.warn("invalid telemetry from device " + device.name + ": " + e.getMessage());
                return; // no PUBACK
            }
            queue.enqueue(msg, new TbQueue.Callback() {
                @Override
                public void onSuccess() {
                    Metrics.ACKED.inc();
                    ack(ch, qos, packetId);
                }

                @Override
                public void onFailure(Throwable t) {
                    BAD_PAYLOAD_LOG.warn("queue rejected a message from " + device.name + ": " + t);
                }
            });
        }

        private void ack(Channel ch, MqttQoS qos, int packetId) {
            if (qos == MqttQoS.AT_LEAST_ONCE) {
                ch.writeAndFlush(MqttMessageBuilders.pubAck().packetId(packetId).build());
            } else if (qos == MqttQoS.EXACTLY_ONCE) {
                ch.writeAndFlush(new MqttMessage(
                    new MqttFixedHeader(MqttMessageType.PUBREC, false, MqttQoS.AT_MOST_ONCE, false, 0),
                    MqttMessageIdVariableHeader.from(packetId)));
            }
        }

        private void onSubscribe(ChannelHandlerContext ctx, MqttSubscribeMessage m) {
            List<Integer> granted = new ArrayList<>();
            for (MqttTopicSubscription s : m.payload().topicSubscriptions()) {
                granted.add(Math.min(s.qualityOfService().value(), 1));
            }
            MqttSubAckMessage ack = new MqttSubAckMessage(
                new MqttFixedHeader(MqttMessageType.SUBACK, false, MqttQoS.AT_MOST_ONCE, false, 0),
                MqttMessageIdVariableHeader.from(m.variableHeader().messageId()),
                new MqttSubAckPayload(granted));
            ctx.writeAndFlush(ack);
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) throws Exception {
            busy = true; // nothing more is processed
            pending.forEach(ReferenceCountUtil::release);
            pending.clear();
            super.channelInactive(ctx);
        }

        @Override
        public void userEventTriggered(ChannelHandlerContext ctx, Object evt) throws Exception {
            if (evt instanceof IdleStateEvent) {
                log.debug("closing idle MQTT connection {}", ctx.channel().remoteAddress());
                ctx.close();
            } else {
                super.userEventTriggered(ctx, evt);
            }
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            log.debug("MQTT connection {} failed: {}", ctx.channel().remoteAddress(), cause.toString());
            ctx.close();
        }
    }
}
