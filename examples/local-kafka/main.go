// Command local-kafka serves a Kafka cluster of one broker on
// 127.0.0.1:9092 for trying idem's Kafka parts without installing Kafka:
// franz-go's kfake, the cluster idem's own tests run against. It speaks
// the wire protocol, consumer groups (the classic protocol and KIP-848's)
// and transactions, creates a topic on first use, and keeps everything in
// memory until it is stopped (Ctrl-C). It is for trying things, not for
// production.
//
//	go run ./examples/local-kafka [--listen 127.0.0.1:9092]
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9092", "address to serve on")
	flag.Parse()
	host, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		log.Fatalf("--listen: %v", err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		log.Fatalf("--listen: %v", err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation(),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, portText))
		}),
		kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	log.Printf("a Kafka cluster of one broker on %s (topics created on first use); Ctrl-C stops it", c.ListenAddrs()[0])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}
