package dev.weir.kscompare;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Watches one engine process from outside, the same way for every engine.
 *
 * <p>Every {@code --poll-ms} (20) it reads the sum of the output topic's end offsets (a {@code
 * ListOffsets} request; records written count, whether or not their transaction has committed
 * yet, so exactly-once runs are not charged for the wait until the last commit) and the engine's
 * CPU time, {@code utime + stime} of {@code /proc/PID/stat}. The window runs from the first poll
 * that sees output to the first that sees {@code --records} outputs (from the last poll that saw
 * none, when one poll sees them all): events/s = outputs in the
 * window / its wall time, CPU µs per event = the process's CPU time in the window / outputs in
 * it. In exactly-once runs the offsets also count the transactions' commit markers, one per
 * partition per commit: a handful in 2,000,000.
 *
 * <p>With {@code --start-topic} (a job of two steps, whose first writes that topic: a
 * repartition or internal topic, which the engine creates), the window starts at the first poll
 * that sees output there instead, so that it holds the first step's work too; events are still
 * the outputs on {@code --topic}.
 *
 * <p>With {@code --go-file}, it creates that file after its first poll: the script starts the
 * engine only then (its command waits for the file), so that no output comes before the first
 * poll and the window starts within one poll of the engine's first record, for every engine.
 *
 * <p>Then, the input all processed, it waits 2 s and reads the process's CPU over {@code
 * --idle-secs} (0: skipped): the cost of an idle, caught-up pipeline, in % of one core.
 *
 * <p>Prints one line: {@code result events_per_s=… cpu_us_per_event=… idle_cpu_pct=… …}. Exits 1
 * if the process dies or no output arrives for {@code --stall-secs} (120).
 */
final class Measure {
    private Measure() {}

    private static final long TICKS_PER_SECOND = 100; // CLK_TCK on Linux

    static void run(Flags flags) throws Exception {
        long target = flags.getLong("records");
        long pid = flags.getLong("pid");
        long pollMs = flags.getLong("poll-ms", 20);
        long idleSecs = flags.getLong("idle-secs", 60);
        long stallNanos = flags.getLong("stall-secs", 120) * 1_000_000_000L;
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("bootstrap"));
        // The start topic is the engine's to create (the broker here would create any topic a
        // client asks about, with its default partitions).
        props.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");
        String startTopic = flags.get("start-topic", "");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(
                props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> partitions = partitions(consumer, flags.get("topic"));
            long startNanos = System.nanoTime();
            long firstNanos = 0, firstCount = 0, firstTicks = 0;
            long lastCount = 0, lastProgressNanos = startNanos;
            // The last poll that saw no output yet.
            long noneNanos = startNanos, noneTicks = cpuTicks(pid);
            List<TopicPartition> startPartitions = List.of();
            String goFile = flags.get("go-file", "");
            boolean polled = false;
            while (true) {
                long count = sum(consumer.endOffsets(partitions));
                if (!startTopic.isEmpty() && startPartitions.isEmpty()) {
                    startPartitions = partitions(consumer, startTopic);
                }
                // What starts the window: outputs, or the first step's.
                long started = startTopic.isEmpty() ? count
                        : startPartitions.isEmpty() ? 0 : sum(consumer.endOffsets(startPartitions));
                long now = System.nanoTime();
                long ticks = cpuTicks(pid);
                if (count > lastCount) {
                    lastCount = count;
                    lastProgressNanos = now;
                }
                if (firstNanos == 0 && started > 0) {
                    if (count >= target) {
                        // Every output between two polls (a small input on a loaded machine,
                        // as in the smoke run): the window starts at the last poll that saw
                        // none, so that it is not empty.
                        firstNanos = noneNanos;
                        firstCount = 0;
                        firstTicks = noneTicks;
                    } else {
                        firstNanos = now;
                        firstCount = count;
                        firstTicks = ticks;
                    }
                } else if (started == 0) {
                    noneNanos = now;
                    noneTicks = ticks;
                }
                if (count >= target) {
                    double seconds = (now - firstNanos) / 1e9;
                    long events = count - firstCount;
                    double cpuSeconds = (double) (ticks - firstTicks) / TICKS_PER_SECOND;
                    double idlePct = idleSecs > 0 ? idle(pid, idleSecs) : Double.NaN;
                    System.out.printf(
                            "result events_per_s=%.0f cpu_us_per_event=%.2f idle_cpu_pct=%.2f"
                                    + " events=%d window_s=%.3f cpu_s=%.2f start_to_first_output_s=%.3f%n",
                            events / seconds, cpuSeconds * 1e6 / events, idlePct, events,
                            seconds, cpuSeconds, (firstNanos - startNanos) / 1e9);
                    return;
                }
                if (!polled) {
                    polled = true;
                    if (!goFile.isEmpty()) {
                        Files.createFile(Path.of(goFile));
                        lastProgressNanos = System.nanoTime();
                    }
                }
                if (now - lastProgressNanos > stallNanos) {
                    System.err.printf("measure: no output for %d s (%d of %d)%n",
                            stallNanos / 1_000_000_000L, count, target);
                    System.exit(1);
                }
                Thread.sleep(pollMs);
            }
        }
    }

    private static double idle(long pid, long seconds) throws Exception {
        Thread.sleep(2_000);
        long before = cpuTicks(pid);
        long start = System.nanoTime();
        Thread.sleep(seconds * 1_000);
        long after = cpuTicks(pid);
        double wall = (System.nanoTime() - start) / 1e9;
        return 100.0 * (after - before) / TICKS_PER_SECOND / wall;
    }

    /** The topic's partitions; none while it does not exist. */
    private static List<TopicPartition> partitions(KafkaConsumer<byte[], byte[]> consumer,
            String topic) {
        List<PartitionInfo> infos = consumer.partitionsFor(topic);
        return infos == null ? List.of() : infos.stream()
                .map(p -> new TopicPartition(p.topic(), p.partition()))
                .toList();
    }

    private static long sum(Map<TopicPartition, Long> offsets) {
        return offsets.values().stream().mapToLong(Long::longValue).sum();
    }

    /** utime + stime of the process, in clock ticks; exits if it is gone. */
    private static long cpuTicks(long pid) throws IOException {
        Path stat = Path.of("/proc", Long.toString(pid), "stat");
        if (!Files.exists(stat)) {
            System.err.println("measure: process " + pid + " is gone");
            System.exit(1);
        }
        String line = Files.readString(stat);
        // The command name, in parentheses, may hold spaces: count fields after its ')'.
        String[] fields = line.substring(line.lastIndexOf(')') + 2).split(" ");
        // Fields 14 and 15 of stat(5); field 3 is fields[0] here.
        return Long.parseLong(fields[11]) + Long.parseLong(fields[12]);
    }
}
