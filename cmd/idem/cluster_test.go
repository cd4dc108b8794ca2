package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/storeurl"
)

var clusterKeys = flag.Int("cluster.keys", 200_000, "records TestKeysOnACluster writes, lists and purges")

// TestKeysOnACluster: idem keys ls and purge --all on a real Redis Cluster
// (3 masters, 3 replicas) visit every record exactly once, walking each
// master with its own SCAN cursor.
func TestKeysOnACluster(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, 3, 1)
	url := "redis://" + cluster.Addrs[0] + "?idem_cluster=1&idem_prefix=" + testenv.RandomName("idemtest:") + ":"
	for _, a := range cluster.Addrs[1:] {
		url += "&addr=" + a
	}
	s, err := storeurl.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := *clusterKeys
	testenv.CompleteMany(t, s, n, func(i int) string {
		return idem.Key{Scope: "orders", ID: fmt.Sprintf("ORD-%06d", i)}.Storage(false)
	})
	s.Close()
	out, err := run(t, "keys", "ls", "--store", url, "--json")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if seen[line] {
			t.Fatalf("listed twice: %s", line)
		}
		seen[line] = true
	}
	if len(seen) != n {
		t.Fatalf("keys ls printed %d records, want %d", len(seen), n)
	}
	out, err = run(t, "keys", "purge", "--all", "--quiet", "--store", url)
	if err != nil || !strings.Contains(out, fmt.Sprintf("purged %d records", n)) {
		t.Fatalf("purge --all: %q %v", out, err)
	}
	if out, err := run(t, "keys", "ls", "--store", url, "--json"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("after purge: %q %v", out, err)
	}
}
