package dev.weir.kscompare;

import java.util.Arrays;

/**
 * Entry point: {@code java -cp ... dev.weir.kscompare.Main COMMAND --flag value ...}.
 *
 * <ul>
 *   <li>{@code counter}: the keyed counter on Kafka Streams ({@link Counter});
 *   <li>{@code rekey}: the re-key-and-count job on Kafka Streams ({@link Rekey});
 *   <li>{@code enrich}: the stream–table enrichment on Kafka Streams ({@link Enrich});
 *   <li>{@code window-join}: the stream–stream window join on Kafka Streams ({@link WindowJoin});
 *   <li>{@code produce-join}: writes the {@code window-join} job's two inputs ({@link ProduceJoin});
 *   <li>{@code produce-table}: writes a table of the {@code enrich} job ({@link ProduceTable});
 *   <li>{@code produce}: writes the input topic ({@link Produce});
 *   <li>{@code measure}: watches an engine from outside ({@link Measure});
 *   <li>{@code topics}: creates and deletes topics ({@link Topics}).
 * </ul>
 */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: Main counter|rekey|enrich|window-join|produce|produce-table|produce-join|measure|topics --flag value ...");
            System.exit(2);
        }
        Flags flags = Flags.parse(Arrays.copyOfRange(args, 1, args.length));
        switch (args[0]) {
            case "counter" -> Counter.run(flags);
            case "rekey" -> Rekey.run(flags);
            case "enrich" -> Enrich.run(flags);
            case "window-join" -> WindowJoin.run(flags);
            case "produce-table" -> ProduceTable.run(flags);
            case "produce-join" -> ProduceJoin.run(flags);
            case "produce" -> Produce.run(flags);
            case "measure" -> Measure.run(flags);
            case "topics" -> Topics.run(flags);
            default -> {
                System.err.println("unknown command: " + args[0]);
                System.exit(2);
            }
        }
    }
}
