package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.state.BuiltInDslStoreSuppliers;

/**
 * The stream–stream window join in the DSL, as a Kafka Streams user writes it: {@code --input}
 * (auctions) {@code join}ed with {@code --right} (bids) of the same key within {@code
 * JoinWindows.ofTimeDifferenceWithNoGrace(--difference-ms)}, every pair to {@code --output} as
 * {@code {"l":auction,"r":bid}}, the bytes concatenated — what Weir's {@code join=window-bytes}
 * guest emits. On {@link ProduceJoin}'s input these pairs are exactly those of the 10 s tumbling
 * windows Weir joins in.
 *
 * <p>Both join stores (window stores with duplicates, changelog on) in the {@code --store} kind
 * through {@code dsl.store.suppliers.class}, record cache off ({@code --cache off}; the join's
 * stores have none anyway).
 */
final class WindowJoin {
    private WindowJoin() {}

    static void run(Flags flags) throws InterruptedException {
        Properties props = Counter.properties(flags);
        if (Counter.cache(flags, props)) {
            throw new IllegalArgumentException("window-join: --cache off");
        }
        props.put(StreamsConfig.DSL_STORE_SUPPLIERS_CLASS_CONFIG, switch (flags.get("store")) {
            case "memory" -> BuiltInDslStoreSuppliers.InMemoryDslStoreSuppliers.class;
            case "rocksdb" -> BuiltInDslStoreSuppliers.RocksDBDslStoreSuppliers.class;
            default -> throw new IllegalArgumentException("--store memory|rocksdb");
        });
        StreamsBuilder builder = new StreamsBuilder();
        Consumed<Bytes, byte[]> consumed = Consumed.with(Serdes.Bytes(), Serdes.ByteArray());
        KStream<Bytes, byte[]> auctions = builder.stream(flags.get("input"), consumed);
        KStream<Bytes, byte[]> bids = builder.stream(flags.get("right"), consumed);
        auctions.join(bids, WindowJoin::pair,
                        JoinWindows.ofTimeDifferenceWithNoGrace(
                                Duration.ofMillis(flags.getLong("difference-ms"))),
                        StreamJoined.with(Serdes.Bytes(), Serdes.ByteArray(), Serdes.ByteArray()))
                .to(flags.get("output"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));
        Counter.start(builder.build(props), props, flags);
    }

    private static final byte[] OPEN = "{\"l\":".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] MIDDLE = ",\"r\":".getBytes(StandardCharsets.US_ASCII);

    /** {@code {"l":left,"r":right}}. */
    static byte[] pair(byte[] left, byte[] right) {
        byte[] out = new byte[OPEN.length + left.length + MIDDLE.length + right.length + 1];
        System.arraycopy(OPEN, 0, out, 0, OPEN.length);
        int at = OPEN.length;
        System.arraycopy(left, 0, out, at, left.length);
        at += left.length;
        System.arraycopy(MIDDLE, 0, out, at, MIDDLE.length);
        at += MIDDLE.length;
        System.arraycopy(right, 0, out, at, right.length);
        out[at + right.length] = '}';
        return out;
    }
}
