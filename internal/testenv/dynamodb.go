package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// DynamoDBEndpointEnv names the DynamoDB endpoint the tests use instead of
// starting dynalite: real DynamoDB (with the standard AWS credentials and
// region in the environment), DynamoDB Local, another emulator.
const DynamoDBEndpointEnv = "IDEM_DYNAMODB_ENDPOINT"

// DynaliteEnv names the dynalite executable; by default
// $XDG_CACHE_HOME/idem-npm/node_modules/.bin/dynalite, where .ci/run
// installs it (npm i dynalite).
const DynaliteEnv = "IDEM_DYNALITE"

// userDynamoDBEndpoint is IDEM_DYNAMODB_ENDPOINT as the process was
// started with (DynamoDB sets it to the dynalite it starts).
var userDynamoDBEndpoint = os.Getenv(DynamoDBEndpointEnv)

var dynamoOnce struct {
	sync.Mutex
	endpoint string
	err      error
}

// survivingAbortedRequests runs dynalite's command (%q: its cli.js) so
// that a request its client aborts mid-body — a connection the campaigns'
// proxy cuts — does not end the process: dynalite rethrows the request's
// ECONNRESET, which Node makes fatal.
const survivingAbortedRequests = `process.on('uncaughtException', (e) => {
	if (e && e.code === 'ECONNRESET') return;
	console.error(e);
	process.exit(1);
});
process.argv.splice(1, 0, 'dynalite');
require(%q);`

// DynamoDB makes the tests' DynamoDB reachable through the standard AWS
// configuration and returns its endpoint: the one IDEM_DYNAMODB_ENDPOINT
// names, else a dynalite this process starts once (in memory, tables made
// at once; on a free loopback port, killed when the process ends). It sets
// AWS_ENDPOINT_URL_DYNAMODB — and, for dynalite, a region and credentials
// where none are set — in this process's environment.
func DynamoDB(t testing.TB) string {
	t.Helper()
	dynamoOnce.Lock()
	defer dynamoOnce.Unlock()
	if dynamoOnce.endpoint == "" && dynamoOnce.err == nil {
		if ep := os.Getenv(DynamoDBEndpointEnv); ep != "" {
			dynamoOnce.endpoint = ep
		} else {
			dynamoOnce.endpoint, dynamoOnce.err = startNPMServer(t, "dynalite", DynaliteEnv, func(bin string, port int) (string, []string, []string) {
				return "node", dynaliteArgs(bin, port, ""), nil
			})
		}
		if dynamoOnce.err == nil {
			os.Setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamoOnce.endpoint)
			os.Setenv(DynamoDBEndpointEnv, dynamoOnce.endpoint)
		}
	}
	Need(t, "DynamoDB (dynalite)", DynaliteEnv, dynamoOnce.err)
	return dynamoOnce.endpoint
}

// DynamoDBClient returns a client of the tests' DynamoDB, configured the
// standard way (config.LoadDefaultConfig).
func DynamoDBClient(t testing.TB) *dynamodb.Client {
	t.Helper()
	DynamoDB(t)
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dynamodb.NewFromConfig(cfg)
}

// dynaliteArgs is node's command line for dynalite on port, with its tables
// in memory, or in files under path (LevelDB) where path is set.
func dynaliteArgs(bin string, port int, path string) []string {
	cli, err := filepath.EvalSymlinks(bin)
	if err != nil {
		cli = bin
	}
	args := []string{"-e", fmt.Sprintf(survivingAbortedRequests, cli), "--",
		"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	if path != "" {
		args = append(args, "--path", path)
	}
	return args
}

// Dynalite is a dynalite of a test's own (StartDynalite), its tables in
// files, which the test may kill and start again.
type Dynalite struct {
	// Endpoint is http://127.0.0.1:PORT.
	Endpoint string

	bin, dir string
	port     int
	proc     *server
	starts   int
}

// StartDynalite starts a dynalite on a free port with its tables in a
// directory of the test's (LevelDB), killed when the test ends. It skips
// the test where IDEM_DYNAMODB_ENDPOINT names the DynamoDB to use (real
// DynamoDB cannot be killed) and under -short.
func StartDynalite(t testing.TB) *Dynalite {
	t.Helper()
	skipShort(t, "a dynalite of its own")
	if userDynamoDBEndpoint != "" {
		t.Skipf("kills a DynamoDB server of its own; %s names %s", DynamoDBEndpointEnv, userDynamoDBEndpoint)
	}
	bin, err := npmBin("dynalite", DynaliteEnv)
	Need(t, "dynalite", DynaliteEnv, err)
	setEmulatorCredentials()
	d := &Dynalite{bin: bin, dir: t.TempDir()}
	t.Cleanup(d.stop)
	startOnFreePorts(t, "dynalite", func(int) error {
		d.port = freePort(t)
		d.Endpoint = "http://127.0.0.1:" + strconv.Itoa(d.port)
		return d.start()
	})
	return d
}

func (d *Dynalite) start() error {
	d.starts++
	log := filepath.Join(d.dir, fmt.Sprintf("dynalite-%d.log", d.starts))
	out, err := os.Create(log)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command("node", dynaliteArgs(d.bin, d.port, filepath.Join(d.dir, "data"))...)
	cmd.Stdout, cmd.Stderr = out, out
	p, err := startServer(cmd, log, "")
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(d.port)
	if err := p.waitReady(30*time.Second, func() error { return listening(addr) }); err != nil {
		p.stop()
		return err
	}
	d.proc = p
	return nil
}

func (d *Dynalite) stop() {
	if d.proc != nil {
		d.proc.stop()
		d.proc = nil
	}
}

// Kill kills the server with SIGKILL: calls fail until Start.
func (d *Dynalite) Kill() { d.stop() }

// Start starts the server again on its port and files, returning once it
// takes connections.
func (d *Dynalite) Start() error {
	held := holdPorts("127.0.0.1:" + strconv.Itoa(d.port))
	err := d.start()
	held.release()
	if err != nil {
		return fmt.Errorf("dynalite on port %d, after the kill: %w", d.port, err)
	}
	return nil
}

// Restart kills the server with SIGKILL and starts it again on its port and
// files: it keeps every write it answered.
func (d *Dynalite) Restart() error {
	d.Kill()
	return d.Start()
}

// OwnDynalite reports whether StartDynalite would start a dynalite rather
// than skip: no IDEM_DYNAMODB_ENDPOINT given, not -short.
func OwnDynalite() bool { return userDynamoDBEndpoint == "" && !testing.Short() }
