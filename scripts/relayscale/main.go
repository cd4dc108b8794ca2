// Command relayscale measures how the outbox relay scales out: the same
// rows, sent over HTTP to an in-process sink, by 1, 2 and 4 `idem relay`
// processes on one PostgreSQL, one run each, printed side by side.
//
//	(cd scripts && go run ./relayscale -idem /path/to/idem -n 20000)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/sqldriver/pgxv5"
)

func main() {
	bin := flag.String("idem", "", "the idem binary (go build ./cmd/idem)")
	n := flag.Int("n", 20000, "rows per run")
	pg := flag.String("pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	flag.Parse()
	if *bin == "" {
		log.Fatal("-idem is required")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *pg)
	check(err)
	defer pool.Close()
	var got atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer sink.Close()
	fmt.Printf("== %d rows per run, HTTP sink, %d cores\n", *n, nproc())
	var base float64
	for _, relays := range []int{1, 2, 4} {
		schema := "relayscale_" + strconv.Itoa(relays)
		_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		check(err)
		ob, err := outbox.New(pgxv5.New(pool), outbox.Config{Schema: schema})
		check(err)
		check(ob.Migrate(ctx))
		rows := make([][]any, *n)
		for i := range rows {
			rows[i] = []any{"K-" + strconv.Itoa(i), sink.URL + "/orders", []byte("order"), "{}"}
		}
		_, err = pool.CopyFrom(ctx, pgx.Identifier{schema, "idem_outbox"}, []string{"key", "destination", "payload", "headers"}, pgx.CopyFromRows(rows))
		check(err)
		got.Store(0)
		start := time.Now()
		var procs []*exec.Cmd
		for range relays {
			cmd := exec.Command(*bin, "relay", "--store", *pg+"&idem_schema="+schema, "--poll", "50ms")
			cmd.Stderr = os.Stderr
			check(cmd.Start())
			procs = append(procs, cmd)
		}
		for {
			var pending int
			check(pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.idem_outbox WHERE status = 'pending'`).Scan(&pending))
			if pending == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		elapsed := time.Since(start)
		for _, p := range procs {
			_ = p.Process.Signal(os.Interrupt)
			_ = p.Wait()
		}
		rate := float64(*n) / elapsed.Seconds()
		if relays == 1 {
			base = rate
		}
		fmt.Printf("%d relay(s)  %8.0f msg/s  (%.2fx of one; %d deliveries for %d rows)\n", relays, rate, rate/base, got.Load(), *n)
		if got.Load() != int64(*n) {
			log.Fatalf("%d deliveries for %d rows: the relays sent a row twice or lost one", got.Load(), *n)
		}
		_, _ = pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)
	}
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	v, _ := strconv.Atoi(string(out[:len(out)-1]))
	return v
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
