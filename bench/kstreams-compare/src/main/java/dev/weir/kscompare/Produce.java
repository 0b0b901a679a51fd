package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.SplittableRandom;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes the input: {@code --records} records over {@code --keys} distinct keys ({@code
 * key-000042}, drawn uniformly with a fixed seed, so every run of the script writes the same
 * topic) to {@code --topic}, which must exist. Each value is a JSON object of about 115 bytes,
 * an order event. Prints {@code produced N bytes B}.
 */
final class Produce {
    private Produce() {}

    /**
     * The producer every writer of the inputs uses ({@code --bootstrap}): linger 20 ms, 256 KiB
     * batches, lz4, acks all.
     */
    static KafkaProducer<byte[], byte[]> producer(Flags flags) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("bootstrap"));
        props.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "262144");
        props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static void run(Flags flags) throws Exception {
        long records = flags.getLong("records");
        int keys = (int) flags.getLong("keys");
        SplittableRandom random = new SplittableRandom(17);
        long bytes = 0;
        try (KafkaProducer<byte[], byte[]> producer = Produce.producer(flags)) {
            for (long i = 0; i < records; i++) {
                int k = random.nextInt(keys);
                byte[] key = String.format("key-%06d", k).getBytes(StandardCharsets.US_ASCII);
                byte[] value = String.format(
                        "{\"order\":%d,\"customer\":\"c-%06d\",\"item\":\"sku-%05d\",\"quantity\":%d,"
                                + "\"price_cents\":%d,\"ts\":%d,\"region\":\"eu-west\"}",
                        i, k, random.nextInt(50_000), 1 + random.nextInt(9),
                        100 + random.nextInt(99_900), 1_767_225_600_000L + i)
                        .getBytes(StandardCharsets.US_ASCII);
                bytes += key.length + value.length;
                producer.send(new ProducerRecord<>(flags.get("topic"), key, value));
            }
            producer.flush();
        }
        System.out.println("produced " + records + " bytes " + bytes);
    }
}
