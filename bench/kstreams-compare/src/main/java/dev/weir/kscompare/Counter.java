package dev.weir.kscompare;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.processor.api.RecordMetadata;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * Weir's counter guest ({@code tests/guests/counter}) on Kafka Streams' Processor API: a count per
 * key in a {@link KeyValueStore}, emitting {@code {"count":n,"offset":o}} under the input key for
 * every record.
 *
 * <p>Flags: {@code --bootstrap}, {@code --input}, {@code --output}, {@code --app-id}, {@code
 * --state-dir}, {@code --store memory|rocksdb}, {@code --threads N}, {@code --guarantee
 * at_least_once|exactly_once_v2}, {@code --commit-ms} (10000), {@code --cache on|off} (on: the
 * store's record cache, as a DSL {@code count()} has it; off: every update goes to the store and
 * downstream at once, which for this job, where every update is emitted anyway, saves the cache's
 * work). Everything else is Kafka Streams' shipped default (changelog on), except the client
 * settings shared with Weir ({@link #SHARED_CLIENT_SETTINGS}). Prints its settings, then runs until
 * SIGTERM.
 */
final class Counter {
    private Counter() {}

    static final String STORE = "counts";

    /**
     * What both engines use: librdkafka's defaults, and Weir's producer settings ({@code
     * host/src/sink/mod.rs}: linger 5 ms, lz4, librdkafka's 1,000,000-byte batch). The fetch
     * sizes are also the Java client's defaults; they are named so that the table prints them.
     */
    static final Map<String, String> SHARED_CLIENT_SETTINGS = Map.of(
            ProducerConfig.LINGER_MS_CONFIG, "5",
            ProducerConfig.BATCH_SIZE_CONFIG, "1000000",
            ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4",
            ConsumerConfig.FETCH_MIN_BYTES_CONFIG, "1",
            ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "500",
            ConsumerConfig.FETCH_MAX_BYTES_CONFIG, "52428800",
            ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, "1048576");

    static void run(Flags flags) throws InterruptedException {
        Properties props = properties(flags);
        KeyValueBytesStoreSupplier supplier = supplier(flags);
        Topology topology = new Topology();
        topology.addSource("input", new ByteArrayDeserializer(), new ByteArrayDeserializer(),
                flags.get("input"));
        topology.addProcessor("count", CountProcessor::new, "input");
        // A store builder's changelog is on by default; its record cache is not (the DSL's is):
        // `--cache on` turns it on, as a DSL `count()` would have it.
        var store = Stores.keyValueStoreBuilder(supplier, Serdes.Bytes(), Serdes.Long());
        if (cache(flags, props)) {
            store = store.withCachingEnabled();
        }
        topology.addStateStore(store, "count");
        topology.addSink("output", flags.get("output"), new ByteArraySerializer(),
                new ByteArraySerializer(), "count");
        start(topology, props, flags);
    }

    /** The application's properties: the flags' and {@link #SHARED_CLIENT_SETTINGS}. */
    static Properties properties(Flags flags) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, flags.get("app-id"));
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, flags.get("state-dir"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, flags.get("threads", "1"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, flags.get("guarantee"));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, flags.get("commit-ms", "10000"));
        for (Map.Entry<String, String> e : SHARED_CLIENT_SETTINGS.entrySet()) {
            String prefix = e.getKey().startsWith("fetch") || e.getKey().startsWith("max.partition")
                    ? StreamsConfig.CONSUMER_PREFIX
                    : StreamsConfig.PRODUCER_PREFIX;
            props.put(prefix + e.getKey(), e.getValue());
        }
        return props;
    }

    /** {@code --store memory|rocksdb}: the store named {@link #STORE}. */
    static KeyValueBytesStoreSupplier supplier(Flags flags) {
        return switch (flags.get("store")) {
            case "memory" -> Stores.inMemoryKeyValueStore(STORE);
            case "rocksdb" -> Stores.persistentKeyValueStore(STORE);
            default -> throw new IllegalArgumentException("--store memory|rocksdb");
        };
    }

    /**
     * {@code --cache on|off}: whether the store gets a record cache; off also sizes the
     * application's cache to 0 (no cache at all, not only none on this store).
     */
    static boolean cache(Flags flags, Properties props) {
        boolean cache = switch (flags.get("cache", "on")) {
            case "on" -> true;
            case "off" -> false;
            default -> throw new IllegalArgumentException("--cache on|off");
        };
        if (!cache) {
            props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        }
        return cache;
    }

    /** Prints the settings and those in effect, then runs {@code topology} until SIGTERM. */
    static void start(Topology topology, Properties props, Flags flags) throws InterruptedException {
        StreamsConfig config = new StreamsConfig(props);
        System.out.println("settings " + new TreeMap<>(config.originals()));
        Map<String, Object> consumer = config.getMainConsumerConfigs(flags.get("app-id"), "c", 0);
        Map<String, Object> producer = config.getProducerConfigs("p");
        Map<String, Object> effective = new TreeMap<>();
        for (String key : SHARED_CLIENT_SETTINGS.keySet()) {
            effective.put(key, consumer.containsKey(key) ? consumer.get(key) : producer.get(key));
        }
        effective.put("consumer.max.poll.records", consumer.get(ConsumerConfig.MAX_POLL_RECORDS_CONFIG));
        effective.put("statestore.cache.max.bytes",
                config.getLong(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG));
        System.out.println("effective " + effective);
        System.out.println("topology " + topology.describe().toString().replace('\n', ' '));
        System.out.flush();

        KafkaStreams streams = new KafkaStreams(topology, props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            stopped.countDown();
        }));
        streams.start();
        stopped.await();
    }

    /** {@code count[key] += 1}, then {@code {"count":n,"offset":o}} forwarded under the key. */
    static final class CountProcessor implements Processor<byte[], byte[], byte[], byte[]> {
        private ProcessorContext<byte[], byte[]> context;
        private KeyValueStore<Bytes, Long> counts;

        @Override
        public void init(ProcessorContext<byte[], byte[]> context) {
            this.context = context;
            this.counts = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<byte[], byte[]> record) {
            Bytes key = Bytes.wrap(record.key());
            Long before = counts.get(key);
            long count = before == null ? 1 : before + 1;
            counts.put(key, count);
            long offset = context.recordMetadata().map(RecordMetadata::offset).orElse(-1L);
            byte[] value = ("{\"count\":" + count + ",\"offset\":" + offset + "}")
                    .getBytes(StandardCharsets.UTF_8);
            context.forward(record.withValue(value));
        }
    }
}
