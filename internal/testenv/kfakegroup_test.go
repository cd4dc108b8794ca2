package testenv_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/testenv"
)

var (
	kfakeClassic = flag.Bool("kfake.classic", false, "TestKafkaGroupOutlivesKilledMembers: run the classic group protocol too")
	kfakeFaults  = flag.Duration("kfake.faults", 20*time.Second, "TestKafkaGroupOutlivesKilledMembers: how long members are killed and frozen")
	kfakeRevoke  = flag.Duration("kfake.revoke", 3*time.Second, "TestKafkaGroupOutlivesKilledMembers: the longest a member takes to let revoked partitions go")
)

const (
	envGroupChild = "IDEM_TESTENV_GROUP_CHILD" // "classic" or "848"
	envGroupTopic = "IDEM_TESTENV_GROUP_TOPIC"
	groupReady    = "IDEM TESTENV GROUP MEMBER READY"
)

// TestKafkaGroupOutlivesKilledMembers is the consumer group alone, without
// idem: members in processes of their own, with the tests' group timings
// (KafkaGroupOptions), consume a topic of eight partitions — blocking
// rebalances while they hold polled records, and taking up to three
// seconds (-kfake.revoke) to let revoked partitions go, as a consumer
// finishing its records in flight does — and commit as they go, while members are killed
// with SIGKILL (and replaced) and frozen with SIGSTOP for twenty seconds
// (-kfake.faults); then the group must settle and commit every partition's end
// within a minute. On a kfake cluster the classic protocol does not (its
// coordinator's rebalance never completes: the group stays in
// PreparingRebalance with the killed members), which is why the tests run
// their groups with KIP-848's protocol there (KafkaGroupOptions); run with
// -kfake.classic to see it.
func TestKafkaGroupOutlivesKilledMembers(t *testing.T) {
	if protocol := os.Getenv(envGroupChild); protocol != "" {
		groupMember(t, protocol)
		return
	}
	if testing.Short() {
		t.Skip("-short: member processes killed and frozen for 20 s")
	}
	protocols := []string{"default"}
	if *kfakeClassic {
		protocols = append(protocols, "classic")
	}
	for _, protocol := range protocols {
		t.Run(protocol, func(t *testing.T) { groupOutlivesKills(t, protocol) })
	}
}

func groupOutlivesKills(t *testing.T, protocol string) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemgroup-", 8)
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	produce := func(n int) {
		for i := range n {
			if err := producer.ProduceSync(context.Background(), &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: []byte("x")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(400)
	members := fleet.New(t, "TestKafkaGroupOutlivesKilledMembers", groupReady, []string{"-kfake.revoke=" + kfakeRevoke.String()}, func(int) []string {
		return []string{envGroupChild + "=" + protocol, envGroupTopic + "=" + topic}
	})
	for range 3 {
		members.Spawn()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for end := time.Now().Add(*kfakeFaults); time.Now().Before(end); {
		if rng.IntN(2) == 0 {
			members.KillOne(rng)
		} else {
			members.FreezeOne(rng, time.Duration(300+rng.IntN(3000))*time.Millisecond)
		}
		produce(20)
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond)
	}
	members.ThawAll()
	produce(400)

	adm := testenv.KafkaAdmin(t, brokers)
	group := "g-" + topic
	var view string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		behind, err := lag(adm, group, topic)
		if err == nil && behind == 0 {
			t.Logf("%s protocol: every partition committed to its end", protocol)
			return
		}
		view = testenv.KafkaGroupView(brokers, group, topic)
	}
	t.Errorf("%s protocol: the group did not commit every partition's end a minute after the kills:\n%s", protocol, view)
}

// lag is how many records of topic the group has not committed.
func lag(adm *kadm.Client, group, topic string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var behind int64
	ends.Each(func(end kadm.ListedOffset) {
		c, _ := committed.Lookup(topic, end.Partition)
		behind += end.Offset - max(c.At, 0)
	})
	return behind, nil
}

// groupMember consumes the topic in the group until it is killed,
// committing every second.
func groupMember(t *testing.T, protocol string) {
	topic := os.Getenv(envGroupTopic)
	opts := testenv.KafkaGroupOptions()
	if protocol == "classic" {
		opts = testenv.KafkaClassicGroupOptions()
	}
	opts = append(opts, kgo.SeedBrokers(strings.Split(os.Getenv("IDEM_KAFKA_BROKERS"), ",")...),
		kgo.ConsumerGroup("g-"+topic), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.BlockRebalanceOnPoll(), kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
			time.Sleep(rand.N(*kfakeRevoke))
			_ = cl.CommitUncommittedOffsets(ctx)
		}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(groupReady)
	for {
		cl.PollFetches(context.Background())
		time.Sleep(time.Duration(rand.IntN(200)) * time.Millisecond) // the records' work
		cl.AllowRebalance()
	}
}
