package io.monsoon.platform;

/** The rule-engine queue between the transports and the storage consumers. */
interface TbQueue {
    /** Ack callbacks for a producer: exactly one of them runs, possibly on another thread. */
    interface Callback {
        void onSuccess();

        void onFailure(Throwable t);
    }

    void start() throws Exception;

    /** Puts the message on the queue; the callback's onSuccess means "acked" (PUBACK / HTTP 200 may be sent). */
    void enqueue(TbMsg msg, Callback callback);

    /** Messages acked but not yet stored, as this process sees it. */
    long size();

    boolean ready();

    void stop();
}
