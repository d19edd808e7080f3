package eo.spark;

import org.apache.spark.sql.api.java.UDF2;

/**
 * The partition Kafka's Java producer picks for a keyed record:
 * {@code toPositive(murmur2(key)) % partitions}, as in
 * {@code org.apache.kafka.clients.producer.internals.BuiltInPartitioner}.
 * Registered by airflow_provider_eo as a Spark SQL function so the prepare step assigns
 * sink partitions inside the JVM (no Python worker round trip). Null key: null.
 */
public final class KafkaPartition implements UDF2<byte[], Integer, Integer> {
    private static final long serialVersionUID = 1L;

    @Override
    public Integer call(byte[] key, Integer partitions) {
        if (key == null || partitions == null) {
            return null;
        }
        return (murmur2(key) & 0x7fffffff) % partitions;
    }

    /** Kafka's {@code Utils.murmur2}, byte for byte. */
    static int murmur2(final byte[] data) {
        final int length = data.length;
        final int m = 0x5bd1e995;
        final int r = 24;
        int h = 0x9747b28c ^ length;
        final int length4 = length / 4;
        for (int i = 0; i < length4; i++) {
            final int i4 = i * 4;
            int k = (data[i4] & 0xff) + ((data[i4 + 1] & 0xff) << 8)
                    + ((data[i4 + 2] & 0xff) << 16) + ((data[i4 + 3] & 0xff) << 24);
            k *= m;
            k ^= k >>> r;
            k *= m;
            h *= m;
            h ^= k;
        }
        switch (length % 4) {
            case 3:
                h ^= (data[(length & ~3) + 2] & 0xff) << 16;
                // fall through
            case 2:
                h ^= (data[(length & ~3) + 1] & 0xff) << 8;
                // fall through
            case 1:
                h ^= data[length & ~3] & 0xff;
                h *= m;
                break;
            default:
                break;
        }
        h ^= h >>> 13;
        h *= m;
        h ^= h >>> 15;
        return h;
    }
}
