package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment naming the Kafka cluster the tests use. With
// IDEM_KAFKA_BROKERS unset, the first test that asks starts a cluster of
// franz-go's kfake in its process and sets both variables, so the helper
// processes it starts (and kills) reach that same cluster.
const (
	envKafkaBrokers = "IDEM_KAFKA_BROKERS"      // host:port[,host:port…]
	envKafkaFake    = "IDEM_KAFKA_FAKE_CLUSTER" // "1": the brokers are a kfake cluster of the test
)

var (
	kafkaOnce sync.Once
	kafkaErr  error
)

// Kafka returns the seed brokers of the tests' Kafka cluster: those of
// IDEM_KAFKA_BROKERS, or those of a kfake cluster running in this process
// (started by the first caller, for the life of the test binary).
func Kafka(t testing.TB) []string {
	t.Helper()
	kafkaOnce.Do(func() {
		if os.Getenv(envKafkaBrokers) != "" {
			return
		}
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
			kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1), kfakeGroupConfigs)
		if err != nil {
			kafkaErr = err
			return
		}
		os.Setenv(envKafkaBrokers, strings.Join(c.ListenAddrs(), ","))
		os.Setenv(envKafkaFake, "1")
	})
	if kafkaErr != nil {
		t.Fatalf("starting a kfake cluster: %v", kafkaErr)
	}
	brokers := strings.Split(os.Getenv(envKafkaBrokers), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = cl.Ping(ctx)
		cancel()
		cl.Close()
	}
	Need(t, "Kafka", os.Getenv(envKafkaBrokers), err)
	return brokers
}

// KafkaBrokers returns the brokers of IDEM_KAFKA_BROKERS when they are a
// real cluster's (not a kfake cluster a test started), or nil.
func KafkaBrokers() []string {
	if v := os.Getenv(envKafkaBrokers); v != "" && !KafkaFake() {
		return strings.Split(v, ",")
	}
	return nil
}

// KafkaFake reports whether the tests' cluster is a kfake cluster of the
// test (rather than IDEM_KAFKA_BROKERS').
func KafkaFake() bool { return os.Getenv(envKafkaFake) == "1" }

// kfakeGroupConfigs are a kfake cluster's timings of KIP-848 groups, whose
// members the broker times out (KafkaGroupOptions): a second, as the
// classic members' session timeout.
var kfakeGroupConfigs = kfake.BrokerConfigs(map[string]string{
	"group.consumer.session.timeout.ms": "1000", "group.consumer.heartbeat.interval.ms": "250"})

// KafkaGroupOptions are the consumer-group settings of the tests: a member
// that dies (SIGKILL) or freezes (SIGSTOP) loses its partitions after a
// second on a kfake cluster, after the six seconds a real broker's default
// group.min.session.timeout.ms allows on IDEM_KAFKA_BROKERS'.
//
// On a kfake cluster the groups speak KIP-848's protocol (the broker
// assigns the partitions; kgo.ServerSideBalancer): kfake's coordinator of
// the classic protocol never completes a rebalance once members die while
// it prepares one — its group stays in PreparingRebalance, keeping the
// dead members, and consumes nothing more (TestKafkaGroupOutlivesKilledMembers
// with -kfake.classic -kfake.revoke=10s shows it without idem). A real cluster's groups keep
// the classic protocol, which real Kafka completes at the rebalance
// timeout.
func KafkaGroupOptions() []kgo.Opt {
	if KafkaBrokers() == nil {
		return append(KafkaClassicGroupOptions(), kgo.ServerSideBalancer())
	}
	return KafkaClassicGroupOptions()
}

// KafkaClassicGroupOptions are KafkaGroupOptions with the classic protocol
// on every cluster.
func KafkaClassicGroupOptions() []kgo.Opt {
	session := time.Second
	if KafkaBrokers() != nil {
		session = 6 * time.Second
	}
	return []kgo.Opt{kgo.SessionTimeout(session), kgo.HeartbeatInterval(session / 4),
		kgo.RebalanceTimeout(20 * time.Second), kgo.FetchMaxWait(200 * time.Millisecond)}
}

// KafkaTopic creates a topic of partitions partitions (and its dead-letter
// topic, name + ".DLT") and returns its name; both are deleted when t ends.
func KafkaTopic(t testing.TB, brokers []string, prefix string, partitions int32) string {
	t.Helper()
	adm := KafkaAdmin(t, brokers)
	name := RandomName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	replication := int16(1)
	if KafkaBrokers() != nil {
		replication = -1 // the cluster's default
	}
	for _, topic := range []string{name, name + ".DLT"} {
		resp, err := adm.CreateTopic(ctx, partitions, replication, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating the topic %s: %v", topic, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name, name+".DLT")
	})
	return name
}

// KafkaAdmin returns an admin client of brokers, closed when t ends.
func KafkaAdmin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// Environment of a kfake server process (ServeKafka).
const (
	envKafkaServe = "IDEM_KAFKA_SERVE" // the data directory
	envKafkaPort  = "IDEM_KAFKA_PORT"
	kafkaReady    = "KFAKE READY"
)

// KafkaServer is a kfake cluster of one broker in a process of its own —
// this test binary re-run, as ServeKafka — keeping its log on disk, so the
// test can kill it with SIGKILL and start it again on its port and files.
// Topics are created by request only.
type KafkaServer struct {
	Addr     string // host:port
	testName string
	dir      string
	starts   int
	proc     *server
}

// StartKafkaServer starts a kfake server process; testName is the calling
// test, which must call ServeKafka first. It is killed when t ends.
func StartKafkaServer(t testing.TB, testName string) *KafkaServer {
	t.Helper()
	s := &KafkaServer{testName: testName, dir: t.TempDir()}
	t.Cleanup(s.stop)
	startOnFreePorts(t, "kfake", func(int) error {
		s.Addr = "127.0.0.1:" + strconv.Itoa(freePort(t))
		return s.start()
	})
	return s
}

func (s *KafkaServer) start() error {
	s.starts++
	log := filepath.Join(s.dir, fmt.Sprintf("kfake-%d.log", s.starts))
	out, err := os.Create(log)
	if err != nil {
		return err
	}
	defer out.Close()
	_, port, _ := strings.Cut(s.Addr, ":")
	cmd := exec.Command(os.Args[0], "-test.run=^"+s.testName+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envKafkaServe+"="+filepath.Join(s.dir, "data"), envKafkaPort+"="+port)
	cmd.Stdout, cmd.Stderr = out, out
	p, err := startServer(cmd, log, "")
	if err != nil {
		return err
	}
	err = p.waitReady(30*time.Second, func() error {
		if err := p.logSays(kafkaReady); err != nil {
			return err
		}
		return listening(s.Addr)
	})
	if err == nil {
		s.proc = p
	}
	return err
}

func (s *KafkaServer) stop() {
	if s.proc != nil {
		s.proc.stop()
		s.proc = nil
	}
}

// Restart kills the server with SIGKILL and starts it again on its port
// and files, returning why it did not come back.
func (s *KafkaServer) Restart() error {
	s.stop()
	held := holdPorts(s.Addr)
	err := s.start()
	held.release()
	if err != nil {
		return fmt.Errorf("kfake on %s, after the kill: %w", s.Addr, err)
	}
	return nil
}

// ServeKafka, in a process StartKafkaServer started, runs the cluster
// until the process is killed; elsewhere it returns at once.
func ServeKafka(t testing.TB) {
	dir := os.Getenv(envKafkaServe)
	if dir == "" {
		return
	}
	port, err := strconv.Atoi(os.Getenv(envKafkaPort))
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SyncWrites(),
		kfake.GroupMinSessionTimeout(100*time.Millisecond), kfakeGroupConfigs)
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Println(kafkaReady)
	select {}
}

// KafkaGroupView describes group's hold on topic as the cluster sees it:
// the group's state and members, and per partition its owner, its
// committed offset and its end offset (how far the group is behind).
func KafkaGroupView(brokers []string, group, topic string) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	owners := map[int32]string{}
	groups, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		fmt.Fprintf(&b, "describing group %s: %v\n", group, err)
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "group %s: state %s, %d members (err %v)\n", g.Group, g.State, len(g.Members), g.Err)
		for _, m := range g.Members {
			fmt.Fprintf(&b, "  member %s (client %s, host %s)\n", m.MemberID, m.ClientID, m.ClientHost)
			if a, ok := m.Assigned.AsConsumer(); ok {
				for _, at := range a.Topics {
					if at.Topic == topic {
						for _, p := range at.Partitions {
							owners[p] = m.ClientID + " " + m.MemberID
						}
					}
				}
			}
		}
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		fmt.Fprintf(&b, "fetching the committed offsets: %v\n", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		fmt.Fprintf(&b, "listing the end offsets: %v\n", err)
	}
	for p := int32(0); ; p++ {
		end, ok := ends.Lookup(topic, p)
		if !ok {
			break
		}
		c, _ := committed.Lookup(topic, p)
		owner := owners[p]
		if owner == "" {
			owner = "none"
		}
		fmt.Fprintf(&b, "  partition %d: committed %d, end %d (%d behind), owner %s\n", p, c.At, end.Offset, end.Offset-max(c.At, 0), owner)
	}
	return b.String()
}
