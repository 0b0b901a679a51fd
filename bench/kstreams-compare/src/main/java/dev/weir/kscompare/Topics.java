package dev.weir.kscompare;

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.errors.TopicExistsException;

/**
 * {@code --create a,b --partitions P}: creates the topics (replication 1; an existing one is
 * kept). {@code --delete-prefix PREFIX}: deletes every topic whose name starts with it.
 */
final class Topics {
    private Topics() {}

    static void run(Flags flags) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, flags.get("bootstrap"));
        try (Admin admin = Admin.create(props)) {
            String create = flags.get("create", "");
            if (!create.isEmpty()) {
                int partitions = (int) flags.getLong("partitions");
                List<NewTopic> topics = new ArrayList<>();
                for (String name : create.split(",")) {
                    topics.add(new NewTopic(name, partitions, (short) 1));
                }
                try {
                    admin.createTopics(topics).all().get();
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                }
            }
            String prefix = flags.get("delete-prefix", "");
            if (!prefix.isEmpty()) {
                Set<String> names = admin.listTopics().names().get();
                List<String> doomed = names.stream().filter(n -> n.startsWith(prefix)).toList();
                if (!doomed.isEmpty()) {
                    admin.deleteTopics(doomed).all().get();
                }
            }
        }
    }
}
