package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Writes a table for the {@code enrich} job to {@code --topic} (which must exist), one row per
 * key, with the Java client's default partitioner (as {@link Produce}, so that a table keyed as
 * the orders is co-partitioned with them):
 *
 * <ul>
 *   <li>{@code --table customers}: {@code --keys} rows keyed as the orders ({@code
 *       key-000042}), {@code {"customer":"c-000042","tier":"gold","country":"DE","since":2019}};
 *   <li>{@code --table items}: {@code --keys} rows keyed {@code sku-00042} (the orders' {@code
 *       item} field; an order's item is one of 50,000, so with 10,000 rows one order in five
 *       finds its item), {@code {"item":"sku-00042","category":"cat-042","weight_g":1042}}.
 * </ul>
 *
 * Prints {@code produced N}.
 */
final class ProduceTable {
    private ProduceTable() {}

    private static final String[] TIERS = {"gold", "silver", "bronze"};
    private static final String[] COUNTRIES = {"DE", "FR", "NL", "PL", "SE", "IE", "ES"};

    static void run(Flags flags) throws Exception {
        int keys = (int) flags.getLong("keys");
        String table = flags.get("table");
        try (KafkaProducer<byte[], byte[]> producer = Produce.producer(flags)) {
            for (int k = 0; k < keys; k++) {
                String key;
                String value;
                switch (table) {
                    case "customers" -> {
                        key = String.format("key-%06d", k);
                        value = String.format(
                                "{\"customer\":\"c-%06d\",\"tier\":\"%s\",\"country\":\"%s\",\"since\":%d}",
                                k, TIERS[k % TIERS.length], COUNTRIES[k % COUNTRIES.length],
                                2010 + k % 15);
                    }
                    case "items" -> {
                        key = String.format("sku-%05d", k);
                        value = String.format(
                                "{\"item\":\"sku-%05d\",\"category\":\"cat-%03d\",\"weight_g\":%d}",
                                k, k % 1000, 100 + k % 5000);
                    }
                    default -> throw new IllegalArgumentException("--table customers|items");
                }
                producer.send(new ProducerRecord<>(flags.get("topic"),
                        key.getBytes(StandardCharsets.US_ASCII),
                        value.getBytes(StandardCharsets.US_ASCII)));
            }
            producer.flush();
        }
        System.out.println("produced " + keys);
    }
}
