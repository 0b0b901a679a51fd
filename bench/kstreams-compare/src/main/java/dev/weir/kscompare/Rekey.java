package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The re-key-and-count job in the DSL, as a Kafka Streams user writes it: {@code
 * groupBy(newKey).count()}, where the new key is {@code fnv1a32(key) mod --modulo} (10,000) in
 * decimal, the same as the counter guest's {@code rekey_modulo} stage in Weir. {@code groupBy}
 * re-keys through a repartition topic ({@code {app-id}-rekey-repartition}), the count is
 * materialized in the store {@link Counter#STORE} (in-memory or RocksDB, changelog on), and every
 * update goes to {@code --output} as {@code {"count":n}} under the new key.
 *
 * <p>The flags are {@link Counter}'s, and {@code --cache} must be {@code off}: with the record
 * cache on, {@code count()} emits only the updates a cache flush or eviction lets through, which is
 * another job than Weir's (every update).
 */
final class Rekey {
    private Rekey() {}

    static void run(Flags flags) throws InterruptedException {
        Properties props = Counter.properties(flags);
        if (Counter.cache(flags, props)) {
            throw new IllegalArgumentException("rekey: --cache off (every update is emitted)");
        }
        int modulo = (int) flags.getLong("modulo", 10_000);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(flags.get("input"), Consumed.with(Serdes.Bytes(), Serdes.Bytes()))
                .groupBy((key, value) -> newKey(key.get(), modulo),
                        Grouped.with("rekey", Serdes.Bytes(), Serdes.Bytes()))
                .count(Materialized.<Bytes, Long>as(Counter.supplier(flags))
                        .withKeySerde(Serdes.Bytes())
                        .withValueSerde(Serdes.Long())
                        .withCachingDisabled())
                .toStream()
                .mapValues(count -> ("{\"count\":" + count + "}").getBytes(StandardCharsets.UTF_8))
                .to(flags.get("output"), Produced.with(Serdes.Bytes(), Serdes.ByteArray()));
        Counter.start(builder.build(props), props, flags);
    }

    /** {@code fnv1a32(key) mod modulo}, in decimal ASCII. */
    static Bytes newKey(byte[] key, int modulo) {
        int hash = 0x811c9dc5;
        for (byte b : key) {
            hash = (hash ^ (b & 0xff)) * 0x01000193;
        }
        long bucket = Integer.toUnsignedLong(hash) % modulo;
        return Bytes.wrap(Long.toString(bucket).getBytes(StandardCharsets.US_ASCII));
    }
}
