package idem_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependencyDirections keeps the package graph pointing the right way:
// what a package links is what its users link. `go list -deps` is the
// source of truth (the same command the README gives).
func TestDependencyDirections(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("the go command is needed to list dependencies")
	}
	for _, c := range []struct {
		pkgs      []string
		forbidden []string
		allowed   []string // exceptions to forbidden
	}{
		// EDI parsing and rendering: no database, no outbox.
		{[]string{"./edi"}, []string{"github.com/jackc/pgx/v5", "modernc.org/sqlite", "github.com/idemgo/idem/outbox"}, nil},
		// The broker adapters know no inbox and no SQL driver.
		{[]string{"./broker", "./broker/watermillidem"}, []string{"github.com/jackc/pgx/v5", "github.com/idemgo/idem/inbox"}, nil},
		// The inbox and the outbox are written on the driver seam: a user
		// of database/sql links no pgx.
		{[]string{"./inbox", "./outbox", "./sqldriver/databasesql"}, []string{"github.com/jackc/pgx/v5", "github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go"}, nil},
		// An HTTP-only relay links neither NATS nor AMQP nor EDI.
		{[]string{"./outbox", "./outbox/httpsender", "./sqldriver/pgxv5"}, []string{"github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go", "github.com/idemgo/idem/edi"}, nil},
		// AS2 (protocol and receiver) links no database, broker or outbox:
		// the receiver's store comes through the idem.Guard it is given.
		{[]string{"./as2", "./as2/receiver"}, []string{"github.com/jackc/pgx/v5", "modernc.org/sqlite", "github.com/redis",
			"github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go", "github.com/idemgo/idem/outbox"}, nil},
		// The store contract is the standard library only: a store's author
		// links nothing else of idem.
		{[]string{"./store"}, []string{"github.com", "golang.org", "go.opentelemetry.io", "modernc.org"}, []string{"github.com/idemgo/idem/store"}},
		// The root package is the standard library and the store contract:
		// no backend.
		{[]string{"."}, []string{"github.com/jackc", "github.com/redis", "github.com/nats-io", "github.com/rabbitmq",
			"github.com/ThreeDotsLabs", "modernc.org", "go.opentelemetry.io", "github.com/prometheus", "github.com/idemgo/idem/store"},
			[]string{"github.com/idemgo/idem/store"}},
	} {
		out, err := exec.Command("go", append([]string{"list", "-deps"}, c.pkgs...)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %v: %v", c.pkgs, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if slices.Contains(c.allowed, dep) {
				continue
			}
			for _, f := range c.forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%v links %s", c.pkgs, dep)
				}
			}
		}
	}
	// Benchmark-only dependencies live in scripts/, a module of its own.
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range []string{"watermill-sql", "github.com/lib/pq"} {
		if strings.Contains(string(mod), dep) {
			t.Errorf("go.mod requires %s, a benchmark-only dependency", dep)
		}
	}
}
