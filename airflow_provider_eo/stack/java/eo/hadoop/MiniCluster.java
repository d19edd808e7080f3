package eo.hadoop;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.Map;
import java.util.TreeMap;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

/**
 * Hadoop's own test cluster in one JVM: a MiniDFSCluster (one NameNode, one DataNode) and a
 * MiniYARNCluster (one ResourceManager, one NodeManager), on 127.0.0.1 with free ports.
 *
 * <p>Usage: {@code MiniCluster <conf dir> <data dir> <nodemanager memory MB> <vcores>}. Once
 * both clusters serve, it writes {@code core-site.xml} (fs.defaultFS), {@code hdfs-site.xml}
 * (the NameNode's HTTP address, for WebHDFS) and {@code yarn-site.xml} (the ResourceManager's
 * addresses) into the conf dir, a HADOOP_CONF_DIR for clients, and then
 * {@code ready} last. It runs until it is signalled; SIGTERM stops YARN (and so its containers)
 * and HDFS.
 */
public final class MiniCluster {
    private static final String[] YARN_KEYS = {
        YarnConfiguration.RM_ADDRESS,
        YarnConfiguration.RM_SCHEDULER_ADDRESS,
        YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS,
        YarnConfiguration.RM_ADMIN_ADDRESS,
        YarnConfiguration.RM_WEBAPP_ADDRESS,
    };

    private MiniCluster() {}

    public static void main(String[] args) throws Exception {
        File confDir = new File(args[0]).getAbsoluteFile();
        File dataDir = new File(args[1]).getAbsoluteFile();
        int memoryMb = Integer.parseInt(args[2]);
        int vcores = Integer.parseInt(args[3]);

        Configuration conf = new YarnConfiguration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(dataDir, "dfs").getPath());
        conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
        conf.setInt("dfs.replication", 1);
        MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).numDataNodes(1).build();
        dfs.waitActive();
        String defaultFs = "hdfs://127.0.0.1:" + dfs.getNameNodePort();
        String webHdfs = "127.0.0.1:" + dfs.getNameNode().getHttpAddress().getPort();

        conf.set("fs.defaultFS", defaultFs);
        // One queue with the whole cluster; an application master may take all of it (the
        // default 10% would leave a Spark driver ACCEPTED forever on a small node).
        conf.set("yarn.scheduler.capacity.root.queues", "default");
        conf.set("yarn.scheduler.capacity.root.default.capacity", "100");
        conf.set("yarn.scheduler.capacity.root.default.maximum-capacity", "100");
        conf.set("yarn.scheduler.capacity.maximum-am-resource-percent", "1.0");
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 128);
        conf.setInt(YarnConfiguration.NM_PMEM_MB, memoryMb);
        conf.setInt(YarnConfiguration.YARN_MINICLUSTER_NM_PMEM_MB, memoryMb);
        conf.setInt(YarnConfiguration.NM_VCORES, vcores);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, memoryMb);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, vcores);
        // Containers are JVMs and Python workers of a test: no memory policing, full disks ok.
        conf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, false);
        conf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
        conf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "100.0");
        // Finished applications' containers go at once; their logs stay in the data dir.
        conf.setInt("yarn.nodemanager.delete.debug-delay-sec", 600);

        MiniYARNCluster yarn = new MiniYARNCluster("eo-yarn", 1, 1, 1);
        yarn.init(conf);
        yarn.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                yarn.stop();
            } finally {
                dfs.shutdown();
            }
        }, "eo-minicluster-stop"));

        // start() may return before the ResourceManager has put its bound port in the config.
        Configuration live = yarn.getConfig();
        long deadline = System.currentTimeMillis() + 60_000;
        while (live.get(YarnConfiguration.RM_ADDRESS, "").endsWith(":0")) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("the ResourceManager did not bind a port within 60 s");
            }
            Thread.sleep(100);
        }
        Map<String, String> core = new TreeMap<>();
        core.put("fs.defaultFS", defaultFs);
        Map<String, String> site = new TreeMap<>();
        site.put(YarnConfiguration.RM_HOSTNAME, "127.0.0.1");
        for (String key : YARN_KEYS) {
            site.put(key, local(live.get(key)));
        }
        confDir.mkdirs();
        write(new File(confDir, "core-site.xml"), core);
        write(new File(confDir, "yarn-site.xml"), site);
        Map<String, String> hdfs = new TreeMap<>();
        hdfs.put("dfs.namenode.http-address", webHdfs);
        hdfs.put("dfs.replication", "1");
        write(new File(confDir, "hdfs-site.xml"), hdfs);
        File ready = new File(confDir, "ready");
        Files.write(ready.toPath(), (defaultFs + "\n").getBytes(StandardCharsets.UTF_8));
        System.out.println("eo minicluster ready: fs.defaultFS=" + defaultFs + " rm=" + site.get(YarnConfiguration.RM_ADDRESS)
                + " web=" + site.get(YarnConfiguration.RM_WEBAPP_ADDRESS));
        System.out.flush();
        Thread.currentThread().join();
    }

    /** {@code host:port} with the host the mini cluster names for itself as 127.0.0.1. */
    private static String local(String address) {
        int colon = address.lastIndexOf(':');
        return "127.0.0.1" + address.substring(colon);
    }

    /** A Hadoop configuration file with {@code props}, replaced atomically. */
    private static void write(File out, Map<String, String> props) throws IOException {
        Configuration conf = new Configuration(false);
        props.forEach(conf::set);
        File tmp = new File(out.getPath() + ".tmp");
        try (OutputStream stream = new FileOutputStream(tmp)) {
            conf.writeXml(stream);
        }
        Files.move(tmp.toPath(), out.toPath(), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }
}
