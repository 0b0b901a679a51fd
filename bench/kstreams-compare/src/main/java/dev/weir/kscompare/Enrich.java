package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.GlobalKTable;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.Stores;

/**
 * The stream–table enrichment in the DSL, as a Kafka Streams user writes it: each order of
 * {@code --input} {@code leftJoin}ed with its key's row of the KTable of {@code --customers}
 * (co-partitioned, 100,000 rows) and then with its item's row of the GlobalKTable of {@code
 * --items} (10,000 rows, looked up by the order's {@code item} field), every order to {@code
 * --output} as {@code {"o":order,"c":row,"i":row}} ({@code null} for a row missing), the bytes
 * concatenated — what Weir's {@code join=enrich} guest does.
 *
 * <p>Both tables in the {@code --store} kind (in-memory or RocksDB), record cache off ({@code
 * --cache off}: it only delays a KTable's updates here), and {@code topology.optimization=all},
 * so that the KTable's source topic is its changelog (no second copy of the table written): the
 * best settings Kafka Streams has for this job.
 */
final class Enrich {
    private Enrich() {}

    private static final byte[] ITEM_FIELD = "\"item\":\"".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] NULL = "null".getBytes(StandardCharsets.US_ASCII);

    static void run(Flags flags) throws InterruptedException {
        Properties props = Counter.properties(flags);
        if (Counter.cache(flags, props)) {
            throw new IllegalArgumentException("enrich: --cache off");
        }
        props.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
        StreamsBuilder builder = new StreamsBuilder();
        KTable<Bytes, byte[]> customers = builder.table(flags.get("customers"),
                Consumed.with(Serdes.Bytes(), Serdes.ByteArray()),
                Materialized.<Bytes, byte[]>as(supplier(flags, "customers"))
                        .withKeySerde(Serdes.Bytes())
                        .withValueSerde(Serdes.ByteArray())
                        .withCachingDisabled());
        GlobalKTable<Bytes, byte[]> items = builder.globalTable(flags.get("items"),
                Consumed.with(Serdes.Bytes(), Serdes.ByteArray()),
                Materialized.<Bytes, byte[]>as(supplier(flags, "items"))
                        .withKeySerde(Serdes.Bytes())
                        .withValueSerde(Serdes.ByteArray())
                        .withCachingDisabled());
        builder.stream(flags.get("input"), Consumed.with(Serdes.Bytes(), Serdes.ByteArray()))
                .leftJoin(customers, Enrich::withCustomer,
                        Joined.with(Serdes.Bytes(), Serdes.ByteArray(), Serdes.ByteArray()))
                .leftJoin(items, (key, partial) -> itemOf(partial), Enrich::withItem)
                .to(flags.get("output"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));
        Counter.start(builder.build(props), props, flags);
    }

    private static KeyValueBytesStoreSupplier supplier(Flags flags, String name) {
        return switch (flags.get("store")) {
            case "memory" -> Stores.inMemoryKeyValueStore(name);
            case "rocksdb" -> Stores.persistentKeyValueStore(name);
            default -> throw new IllegalArgumentException("--store memory|rocksdb");
        };
    }

    /** {@code {"o":order,"c":customer} } without its closing brace (the item joins next). */
    static byte[] withCustomer(byte[] order, byte[] customer) {
        byte[] c = customer == null ? NULL : customer;
        byte[] out = new byte[order.length + c.length + 10];
        int at = put(out, 0, "{\"o\":");
        System.arraycopy(order, 0, out, at, order.length);
        at = put(out, at + order.length, ",\"c\":");
        System.arraycopy(c, 0, out, at, c.length);
        return out;
    }

    /** The partial record with {@code ,"i":item} and its closing brace. */
    static byte[] withItem(byte[] partial, byte[] item) {
        byte[] i = item == null ? NULL : item;
        int used = partial.length;
        byte[] out = Arrays.copyOf(partial, used + i.length + 6);
        int at = put(out, used, ",\"i\":");
        System.arraycopy(i, 0, out, at, i.length);
        out[at + i.length] = '}';
        return out;
    }

    /** The order's {@code "item":"…"} value (found by its bytes), or null. */
    static Bytes itemOf(byte[] partial) {
        outer:
        for (int s = 0; s + ITEM_FIELD.length <= partial.length; s++) {
            for (int j = 0; j < ITEM_FIELD.length; j++) {
                if (partial[s + j] != ITEM_FIELD[j]) {
                    continue outer;
                }
            }
            int from = s + ITEM_FIELD.length;
            int to = from;
            while (to < partial.length && partial[to] != '"') {
                to++;
            }
            return Bytes.wrap(Arrays.copyOfRange(partial, from, to));
        }
        return null;
    }

    private static int put(byte[] out, int at, String ascii) {
        byte[] b = ascii.getBytes(StandardCharsets.US_ASCII);
        System.arraycopy(b, 0, out, at, b.length);
        return at + b.length;
    }
}
