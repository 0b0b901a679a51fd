package dev.weir.kscompare;

import java.util.HashMap;
import java.util.Map;

/** {@code --name value} pairs; a missing required flag or a stray argument ends the program. */
final class Flags {
    private final Map<String, String> values = new HashMap<>();

    static Flags parse(String[] args) {
        Flags flags = new Flags();
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value, got: " + args[i]);
            }
            flags.values.put(args[i].substring(2), args[i + 1]);
        }
        return flags;
    }

    String get(String name) {
        String v = values.get(name);
        if (v == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return v;
    }

    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    long getLong(String name) {
        return Long.parseLong(get(name));
    }

    long getLong(String name, long fallback) {
        String v = values.get(name);
        return v == null ? fallback : Long.parseLong(v);
    }
}
