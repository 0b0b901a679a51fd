package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.util.SplittableRandom;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Writes the {@code window-join} job's two inputs: {@code --records} records in all, each to
 * {@code --left} (auctions) or {@code --right} (bids) with even odds, keyed over {@code --keys}
 * distinct keys ({@code key-000042}, uniform, fixed seed), both topics partitioned alike (the Java
 * client's default partitioner), with event times ({@code CreateTime}) that rise with the record's
 * index.
 *
 * <p>The event times fill {@code --windows} consecutive tumbling windows of {@code --window-ms},
 * aligned to the epoch and ending before {@code --now-ms}, each holding an equal share of the
 * records, spread over the first {@code --spread-ms} of its window (at most half of it). So
 * two records of one key are in the same tumbling window exactly when their event times differ by
 * less than {@code --spread-ms} (and those of other windows by more): Weir's tumbling window join and Kafka Streams' sliding {@code
 * JoinWindows} of that time difference emit the same pairs.
 *
 * <p>Prints {@code produced N bytes B results R}: R the number of join results, the sum over
 * every key and window of its left records times its right ones.
 */
final class ProduceJoin {
    private ProduceJoin() {}

    static void run(Flags flags) throws Exception {
        long records = flags.getLong("records");
        int keys = (int) flags.getLong("keys");
        int windows = (int) flags.getLong("windows");
        long windowMs = flags.getLong("window-ms");
        long spreadMs = flags.getLong("spread-ms");
        if (spreadMs < 1 || 2 * spreadMs > windowMs) {
            throw new IllegalArgumentException("--spread-ms: 1 to half of --window-ms");
        }
        long now = flags.getLong("now-ms");
        long first = now - now % windowMs - (long) windows * windowMs;
        long perWindow = (records + windows - 1) / windows;
        // Records of each key, window and side: left at 2 * cell, right at 2 * cell + 1.
        int[] counts = new int[2 * keys * windows];
        SplittableRandom random = new SplittableRandom(23);
        long bytes = 0;
        try (KafkaProducer<byte[], byte[]> producer = Produce.producer(flags)) {
            for (long i = 0; i < records; i++) {
                int window = (int) (i / perWindow);
                long ts = first + window * windowMs + (i % perWindow) * spreadMs / perWindow;
                int k = random.nextInt(keys);
                boolean left = random.nextBoolean();
                counts[2 * (k * windows + window) + (left ? 0 : 1)]++;
                byte[] key = String.format("key-%06d", k).getBytes(StandardCharsets.US_ASCII);
                String value = left
                        ? String.format("{\"auction\":%d,\"seller\":\"p-%06d\",\"category\":%d,"
                                + "\"initial_bid\":%d,\"ts\":%d}",
                                i, k, random.nextInt(30), 100 + random.nextInt(9_900), ts)
                        : String.format("{\"bid\":%d,\"bidder\":\"p-%06d\",\"price\":%d,"
                                + "\"channel\":\"app\",\"ts\":%d}",
                                i, random.nextInt(1_000_000), 100 + random.nextInt(99_900), ts);
                byte[] bytesOf = value.getBytes(StandardCharsets.US_ASCII);
                bytes += key.length + bytesOf.length;
                String topic = flags.get(left ? "left" : "right");
                producer.send(new ProducerRecord<>(topic, null, ts, key, bytesOf));
            }
            producer.flush();
        }
        long results = 0;
        for (int cell = 0; cell < keys * windows; cell++) {
            results += (long) counts[2 * cell] * counts[2 * cell + 1];
        }
        System.out.println("produced " + records + " bytes " + bytes + " results " + results);
    }
}
