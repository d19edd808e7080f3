package eo.kafka;

import java.io.FileInputStream;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.EnumSet;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeProducersResult;
import org.apache.kafka.clients.admin.DescribeTransactionsResult;
import org.apache.kafka.clients.admin.ListTransactionsOptions;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.common.TopicPartition;

/**
 * Kafka's transaction admin calls for eo (librdkafka has none): one JSON object per line on
 * stdout, errors as {"kind":"error",...} lines, exit 0 when every call answered.
 *
 * <pre>
 * java -cp JARS eo.kafka.Transactions PROPS TIMEOUT_MS list TOPIC:PARTITION...
 * java -cp JARS eo.kafka.Transactions PROPS TIMEOUT_MS abort TOPIC:PARTITION PRODUCER_ID EPOCH COORDINATOR_EPOCH
 * </pre>
 *
 * PROPS is the admin client's properties file (it may hold secrets: it is never printed).
 * "list" prints every transaction the coordinators hold open ("transaction" lines: id, producer
 * id/epoch, state, start time, timeout, partitions) and every producer with an open transaction
 * on the given partitions ("producer" lines: the partition leader's view, which also shows a
 * hanging transaction its coordinator no longer knows). "abort" writes an abort marker for one
 * producer's open transaction on one partition (KIP-664's abortTransaction).
 */
public final class Transactions {
    private Transactions() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            fail("usage", "expected PROPS TIMEOUT_MS list|abort ...");
        }
        Properties props = new Properties();
        try (InputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        long timeoutMs = Long.parseLong(args[1]);
        String budget = Long.toString(timeoutMs);
        props.putIfAbsent("default.api.timeout.ms", budget);
        props.putIfAbsent("request.timeout.ms", Long.toString(Math.max(1000L, timeoutMs / 2)));
        props.putIfAbsent("client.id", "eo-transactions");
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        int rc;
        try (Admin admin = Admin.create(props)) {
            switch (args[2]) {
                case "list":
                    rc = list(admin, partitions(args, 3, args.length), timeoutMs, out);
                    break;
                case "abort":
                    if (args.length != 7) {
                        fail("usage", "abort needs TOPIC:PARTITION PRODUCER_ID EPOCH COORDINATOR_EPOCH");
                    }
                    TopicPartition tp = partitions(args, 3, 4).get(0);
                    AbortTransactionSpec spec = new AbortTransactionSpec(
                        tp, Long.parseLong(args[4]), Short.parseShort(args[5]), Integer.parseInt(args[6]));
                    admin.abortTransaction(spec).all().get(timeoutMs, TimeUnit.MILLISECONDS);
                    out.println("{\"kind\":\"aborted\",\"topic\":" + str(tp.topic()) + ",\"partition\":"
                        + tp.partition() + ",\"producer_id\":" + args[4] + "}");
                    rc = 0;
                    break;
                default:
                    fail("usage", "unknown command " + args[2]);
                    return;
            }
        } catch (ExecutionException e) {
            error(out, "call", e.getCause());
            rc = 1;
        } catch (java.util.concurrent.TimeoutException e) {
            error(out, "timeout", e);
            rc = 1;
        }
        out.flush();
        System.exit(rc);
    }

    private static int list(Admin admin, List<TopicPartition> partitions, long timeoutMs, PrintStream out)
            throws Exception {
        int rc = 0;
        // Open on a coordinator: everything but the finished and the empty states.
        EnumSet<TransactionState> open = EnumSet.of(
            TransactionState.ONGOING, TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT,
            TransactionState.PREPARE_EPOCH_FENCE);
        Collection<TransactionListing> listed = admin.listTransactions(new ListTransactionsOptions().filterStates(open))
            .all().get(timeoutMs, TimeUnit.MILLISECONDS);
        List<String> ids = new ArrayList<>();
        for (TransactionListing l : listed) {
            ids.add(l.transactionalId());
        }
        if (!ids.isEmpty()) {
            DescribeTransactionsResult described = admin.describeTransactions(ids);
            for (String id : ids) {
                TransactionDescription d;
                try {
                    d = described.description(id).get(timeoutMs, TimeUnit.MILLISECONDS);
                } catch (ExecutionException ex) {  // ended or expired since the listing
                    error(out, "describe " + id, ex.getCause());
                    continue;
                }
                StringBuilder parts = new StringBuilder();
                for (TopicPartition tp : d.topicPartitions()) {
                    parts.append(parts.length() == 0 ? "" : ",").append("[").append(str(tp.topic())).append(",")
                        .append(tp.partition()).append("]");
                }
                out.println("{\"kind\":\"transaction\",\"transactional_id\":" + str(id)
                    + ",\"producer_id\":" + d.producerId() + ",\"producer_epoch\":" + d.producerEpoch()
                    + ",\"coordinator_id\":" + d.coordinatorId() + ",\"state\":" + str(d.state().name())
                    + ",\"start_ms\":" + (d.transactionStartTimeMs().isPresent() ? d.transactionStartTimeMs().getAsLong() : -1)
                    + ",\"timeout_ms\":" + d.transactionTimeoutMs() + ",\"partitions\":[" + parts + "]}");
            }
        }
        if (!partitions.isEmpty()) {
            DescribeProducersResult producers = admin.describeProducers(partitions);
            for (TopicPartition tp : partitions) {
                List<ProducerState> active;
                try {
                    active = producers.partitionResult(tp).get(timeoutMs, TimeUnit.MILLISECONDS).activeProducers();
                } catch (ExecutionException ex) {  // e.g. no Read permission on that topic
                    error(out, "producers " + tp, ex.getCause());
                    rc = 1;
                    continue;
                }
                for (ProducerState p : active) {
                    if (p.currentTransactionStartOffset().isEmpty()) {
                        continue;  // no open transaction on this partition
                    }
                    out.println("{\"kind\":\"producer\",\"topic\":" + str(tp.topic()) + ",\"partition\":" + tp.partition()
                        + ",\"producer_id\":" + p.producerId() + ",\"producer_epoch\":" + p.producerEpoch()
                        + ",\"coordinator_epoch\":" + p.coordinatorEpoch().orElse(-1)
                        + ",\"start_offset\":" + p.currentTransactionStartOffset().getAsLong()
                        + ",\"last_timestamp\":" + p.lastTimestamp() + "}");
                }
            }
        }
        return rc;
    }

    private static List<TopicPartition> partitions(String[] args, int from, int to) {
        List<TopicPartition> out = new ArrayList<>();
        for (int i = from; i < to; i++) {
            int colon = args[i].lastIndexOf(':');
            if (colon <= 0) {
                fail("usage", "not TOPIC:PARTITION: " + args[i]);
            }
            out.add(new TopicPartition(args[i].substring(0, colon), Integer.parseInt(args[i].substring(colon + 1))));
        }
        return out;
    }

    private static void error(PrintStream out, String what, Throwable e) {
        String type = e == null ? "?" : e.getClass().getSimpleName();
        String message = e == null ? "" : String.valueOf(e.getMessage());
        out.println("{\"kind\":\"error\",\"call\":" + str(what) + ",\"type\":" + str(type) + ",\"message\":"
            + str(message) + "}");
    }

    private static void fail(String what, String message) {
        System.out.println("{\"kind\":\"error\",\"call\":" + str(what) + ",\"type\":\"usage\",\"message\":"
            + str(message) + "}");
        System.exit(2);
    }

    /** A JSON string literal. */
    static String str(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
