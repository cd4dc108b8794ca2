package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/httpidem"
	"github.com/idemgo/idem/internal/drain"
	"github.com/idemgo/idem/internal/fleet"
	"github.com/idemgo/idem/internal/testenv"
)

var (
	gatewayCampaignDurationFlag = flag.Duration("gateway.campaign.duration", 8*time.Second, "how long the gateway fault campaigns inject faults")
	gatewayCampaignSeed         = flag.Uint64("gateway.campaign.seed", 0, "seed of the gateway fault campaign (0: a new one, printed)")
)

const (
	envGatewayArgs   = "IDEM_GATEWAY_CAMPAIGN_ARGS" // idem serve's arguments, a line each
	gatewayReadyLine = "gateway campaign: serving"
	// The campaign's lease: slow upstream calls outlive it on heartbeats,
	// frozen gateways lose it.
	gatewayLease = 2 * time.Second
	// gatewayUpstreamTimeout is --upstream-timeout: an upstream call that
	// answers later is a 504, and its key is held.
	gatewayUpstreamTimeout = 4 * time.Second
)

// TestGatewayCampaign runs the HTTP role under faults: clients retry POSTs
// with an Idempotency-Key through several idem serve processes that are
// killed (SIGKILL) and frozen (SIGSTOP), in front of an upstream that
// answers slowly, fails, drops the connection or times out, over a
// PostgreSQL store that half the gateways reach through a proxy which cuts
// and stalls it (a partition). See gatewayCampaign for what it checks.
func TestGatewayCampaign(t *testing.T) {
	if gatewayHelper(t) {
		return
	}
	testenv.ProbePostgres(t)
	schema := testenv.RandomName("idemtest_")
	t.Cleanup(func() {
		if conn, err := pgx.Connect(context.Background(), testenv.PostgresURL); err == nil {
			_, _ = conn.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
			conn.Close(context.Background())
		}
	})
	proxied, proxy := testenv.PostgresProxy(t)
	gatewayCampaign(t, gatewayCampaignConfig{
		TestName: "TestGatewayCampaign",
		Proxied:  proxied + "&idem_schema=" + schema,
		Direct:   testenv.PostgresURL + "&idem_schema=" + schema,
		proxy:    proxy,
	})
}

// TestGatewayCampaignRedis is TestGatewayCampaign on a Redis store.
func TestGatewayCampaignRedis(t *testing.T) {
	if gatewayHelper(t) {
		return
	}
	if testing.Short() {
		t.Skip("-short: TestGatewayCampaign runs the gateway campaign on PostgreSQL")
	}
	proxy := testenv.RedisProxy(t)
	c := testenv.RedisClient(t)
	direct := c.Options().Addr
	prefix := testenv.RandomName("idemtest:") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		if keys, err := c.Keys(ctx, prefix+"*").Result(); err == nil && len(keys) > 0 {
			c.Del(ctx, keys...)
		}
		c.Close()
	})
	at := func(addr string) string { return "redis://" + addr + "/0?idem_prefix=" + url.QueryEscape(prefix) }
	gatewayCampaign(t, gatewayCampaignConfig{
		TestName: "TestGatewayCampaignRedis",
		Proxied:  at(proxy.Addr()),
		Direct:   at(direct),
		proxy:    proxy,
	})
}

// TestGatewayCampaignSQLite is TestGatewayCampaign on idem serve's default
// store, one SQLite file shared by the gateways: kills and freezes, no
// outages.
func TestGatewayCampaignSQLite(t *testing.T) {
	if gatewayHelper(t) {
		return
	}
	if testing.Short() {
		t.Skip("-short: TestGatewayCampaign runs the gateway campaign on PostgreSQL")
	}
	store := "sqlite:" + filepath.Join(t.TempDir(), "gateways.db")
	gatewayCampaign(t, gatewayCampaignConfig{TestName: "TestGatewayCampaignSQLite", Proxied: store, Direct: store})
}

// gatewayHelper runs idem serve with the arguments in the environment when
// this process is one of a campaign's gateways, and reports whether it is.
func gatewayHelper(t *testing.T) bool {
	args := os.Getenv(envGatewayArgs)
	if args == "" {
		return false
	}
	argv := strings.Split(args, "\n")
	listen := argv[slices.Index(argv, "--listen")+1]
	// A gateway started while the store is cut off cannot open it: it is
	// started again, as a supervisor would.
	var done chan error
	start := func() {
		root := newRootCmd()
		root.SetArgs(argv)
		done = make(chan error, 1)
		go func() { done <- root.ExecuteContext(context.Background()) }()
	}
	start()
	for restarts := 0; ; {
		select {
		case err := <-done:
			if restarts++; restarts > 300 {
				t.Fatalf("idem serve ended before it listened, %d times: %v", restarts, err)
			}
			time.Sleep(100 * time.Millisecond)
			start()
		default:
		}
		if c, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
			c.Close()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(gatewayReadyLine)
	t.Fatalf("idem serve ended: %v", <-done) // it runs until the campaign kills it
	return true
}

type gatewayCampaignConfig struct {
	TestName string
	// Proxied and Direct are the store's URL through the proxy and not:
	// odd gateways use the first, even ones the second.
	Proxied, Direct string
	proxy           *testenv.Proxy // nil: no outages (SQLite)
}

// execution is one request the upstream received.
type execution struct {
	id                      int
	proc                    int // the gateway that sent it
	key, principal, payload string
	reqID                   string
	start, end              int64  // unix ns
	status                  int    // 0: no answer (dropped, or cancelled by the gateway)
	fence                   uint64 // Idempotency-Fence
	stale                   bool   // refused: a larger fence of its key had come first
	broken                  bool   // its body could not be read: its gateway died or gave up sending it
	cancelled, dropped      bool
	body                    string
}

// complete reports whether the gateway stores and replays the execution's
// answer (httpidem.DefaultPolicy).
func (e *execution) complete() bool {
	return e.status != 0 && !e.cancelled && httpidem.DefaultPolicy(e.status) == idem.Complete
}

// campaignUpstream is the service behind the gateways. It records every
// request it receives and, like a service that conditions its writes on
// the fence, refuses one whose fence is below the largest its key came
// with (409); the others it answers at random: at once, slowly (past the
// lease on heartbeats), 500, 400, by dropping the connection (before its
// answer, or in the middle of it) or not before the gateway's upstream
// timeout. Once behave is set it answers 201 at once.
type campaignUpstream struct {
	behave   atomic.Bool
	inflight sync.WaitGroup
	mu       sync.Mutex
	rng      *rand.Rand
	execs    []*execution
	fences   map[[2]string]uint64 // key and principal → the largest fence
}

func (u *campaignUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.inflight.Add(1)
	defer u.inflight.Done()
	body, readErr := io.ReadAll(r.Body)
	proc, _ := strconv.Atoi(strings.TrimPrefix(strings.Split(r.URL.Path, "/")[1], "g"))
	u.mu.Lock()
	e := &execution{id: len(u.execs) + 1, proc: proc, key: r.Header.Get(httpidem.HeaderName), principal: r.Header.Get("Authorization"),
		payload: string(body), reqID: r.Header.Get("X-Request-Id"), start: time.Now().UnixNano()}
	u.execs = append(u.execs, e)
	if readErr != nil { // its gateway died or gave up sending it: no request, no effect
		e.broken, e.end = true, time.Now().UnixNano()
		u.mu.Unlock()
		return
	}
	e.fence, _ = strconv.ParseUint(r.Header.Get(httpidem.FenceHeader), 10, 64)
	if k := [2]string{e.key, e.principal}; e.fence < u.fences[k] {
		e.stale, e.end, e.status, e.body = true, time.Now().UnixNano(), http.StatusConflict, "stale fence"
		u.mu.Unlock()
		w.Header().Set("X-Exec", strconv.Itoa(e.id))
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, e.body)
		return
	} else {
		u.fences[k] = e.fence
	}
	pick, wait := u.rng.IntN(100), time.Duration(u.rng.IntN(50))*time.Millisecond
	if pick >= 50 && pick < 65 {
		wait = time.Duration(300+u.rng.IntN(2700)) * time.Millisecond // up to 1.5 leases
	}
	u.mu.Unlock()
	finish := func(status int, cancelled, dropped bool, body string) {
		u.mu.Lock()
		defer u.mu.Unlock()
		e.end, e.status, e.cancelled, e.dropped, e.body = time.Now().UnixNano(), status, cancelled, dropped, body
	}
	status := http.StatusCreated
	switch {
	case u.behave.Load():
	case pick >= 65 && pick < 75:
		status = http.StatusInternalServerError // released: the retry runs again
	case pick >= 75 && pick < 80:
		status = http.StatusBadRequest // a business refusal, stored like a success
	case pick >= 80 && pick < 85: // the gateway answers 502 and holds the key
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		finish(0, false, true, "")
		return
	case pick >= 85 && pick < 90:
		wait = gatewayUpstreamTimeout + time.Second // the gateway answers 504 and holds the key
	case pick >= 90 && pick < 93: // dies in the middle of its answer: never replayed cut short
		w.Header().Set("Content-Length", "100")
		w.Header().Set("X-Exec", strconv.Itoa(e.id))
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"exec":`)
		_ = http.NewResponseController(w).Flush()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		finish(0, false, true, "")
		return
	}
	select {
	case <-time.After(wait):
	case <-r.Context().Done():
		finish(0, true, false, "")
		return
	}
	out := fmt.Sprintf(`{"exec":%d,"key":%q,"principal":%q,"payload":%q,"status":%d}`, e.id, e.key, e.principal, e.payload, status)
	w.Header().Set("X-Exec", strconv.Itoa(e.id))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, out)
	finish(status, false, false, out)
}

// campaignKey is one idempotency key of one principal, and what its
// requests carry.
type campaignKey struct {
	id, principal, payload, rogue string
}

// attempt is one request a client sent and what came back.
type attempt struct {
	key            *campaignKey
	payload, reqID string
	gateway        int
	sent, got      int64 // unix ns; got 0: no answer (timeout, refused, cut)
	status         int
	replayed       bool
	problem        string // the problem type's slug, for problem+json
	exec           int    // X-Exec, when the answer carries it
	body           string
}

// final reports whether the answer ends the client's retries: the stored
// kind, or a 422 (the key belongs to another request).
func (a *attempt) final() bool {
	if a.got == 0 {
		return false
	}
	return a.problem == "mismatch" || a.problem == "" && a.exec != 0 && httpidem.DefaultPolicy(a.status) == idem.Complete
}

type gatewayCampaignRun struct {
	t        *testing.T
	up       *campaignUpstream
	procs    *fleet.Fleet
	mu       sync.Mutex
	addrs    map[int]string // gateway process → its address
	attempts []*attempt
	outages  *testenv.Outages // nil: none (SQLite)
	nextReq  atomic.Int64
	client   *http.Client
	began    int64 // unix ns
}

// live returns the address of a gateway not known to be killed.
func (g *gatewayCampaignRun) live(rng *rand.Rand) (int, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		n := 1 + rng.IntN(len(g.addrs))
		if _, killed := g.procs.KilledAt(n); !killed {
			return n, g.addrs[n]
		}
	}
}

// send posts payload under key through a live gateway, waiting at most
// timeout, and records the attempt.
func (g *gatewayCampaignRun) send(rng *rand.Rand, k *campaignKey, payload string, timeout time.Duration) *attempt {
	n, addr := g.live(rng)
	a := &attempt{key: k, payload: payload, gateway: n, reqID: "r" + strconv.FormatInt(g.nextReq.Add(1), 10)}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/payments", strings.NewReader(payload))
	// One transmission per attempt: Go's Transport would resend a request
	// with a (canonically spelt) Idempotency-Key whose connection broke — the
	// gateway then answers the resend, say 409, for a request it forwarded.
	req.Header[strings.ToLower(httpidem.HeaderName)] = []string{strconv.Quote(k.id)}
	req.Header.Set("Authorization", k.principal)
	req.Header.Set("X-Request-Id", a.reqID)
	a.sent = time.Now().UnixNano()
	resp, err := g.client.Do(req)
	if err == nil {
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil {
			a.got, a.status, a.body = time.Now().UnixNano(), resp.StatusCode, string(body)
			a.replayed = resp.Header.Get(httpidem.ReplayedHeader) == "true"
			a.exec, _ = strconv.Atoi(resp.Header.Get("X-Exec"))
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
				var p struct{ Type string }
				_ = json.Unmarshal(body, &p)
				a.problem = p.Type[strings.LastIndex(p.Type, "#")+1:]
			}
		}
	}
	g.mu.Lock()
	g.attempts = append(g.attempts, a)
	g.mu.Unlock()
	return a
}

// gatewayCampaign runs the campaign and checks, once the faults are over:
//   - every request the upstream received was sent by a client with the
//     same key, principal and body, and reached it once (no request is
//     forwarded twice, or with someone else's key);
//   - a replay (Idempotent-Replayed) is the answer of an execution of the
//     same key, principal and body whose status the gateway stores, byte
//     for byte, and was not forwarded; every replay of a key names the
//     same execution — the one replayed at the end; a 409, 422 or 503
//     problem was not forwarded either (no work without a claim), and a 422
//     came after a request with another body under the key;
//   - an answer forwarded from the upstream is the execution of that very
//     request;
//   - two executions of a key never overlapped in time, unless the gateway
//     of the first was frozen or killed meanwhile (a frozen gateway cannot
//     cancel its upstream call when its lease runs out);
//   - no execution of a key started after the execution whose answer is
//     stored, and any other execution whose answer would have been stored
//     lost its settle to a fault: its gateway killed or frozen, or cut off
//     from the store, before the stored one started;
//   - after the faults, every key has a stored answer, replayed (the
//     gateways given as long as keys get theirs: internal/drain).
func gatewayCampaign(t *testing.T, cfg gatewayCampaignConfig) {
	seed := *gatewayCampaignSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("gateway campaign seed %d (replay: -gateway.campaign.seed=%d), duration %v", seed, seed, gatewayCampaignDuration())
	up := &campaignUpstream{rng: rand.New(rand.NewPCG(seed, 1)), fences: map[[2]string]uint64{}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	g := &gatewayCampaignRun{t: t, up: up, addrs: map[int]string{}, began: time.Now().UnixNano(),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	g.procs = fleet.New(t, cfg.TestName, gatewayReadyLine, nil, func(n int) []string {
		addr := freeAddr(t)
		store := cfg.Direct
		if n%2 == 1 {
			store = cfg.Proxied
		}
		g.mu.Lock()
		g.addrs[n] = addr
		g.mu.Unlock()
		args := []string{"serve", "--listen", addr, "--upstream", fmt.Sprintf("%s/g%d", srv.URL, n), "--store", store,
			"--lease", gatewayLease.String(), "--upstream-timeout", gatewayUpstreamTimeout.String(),
			"--retention", "1h", "--sweep-interval", "0"}
		return []string{envGatewayArgs + "=" + strings.Join(args, "\n")}
	})
	for range 4 {
		g.procs.Spawn()
	}

	// Keys: each id is used by two principals with the same body, so an
	// answer given to the wrong principal would be seen; one key in ten
	// also gets a request with another body (a client reusing a key); one
	// in eight has no body.
	var keys []*campaignKey
	var keysMu sync.Mutex
	newKey := func(rng *rand.Rand) []*campaignKey {
		keysMu.Lock()
		defer keysMu.Unlock()
		id := fmt.Sprintf("order-%d", len(keys)/2)
		ks := []*campaignKey{{id: id, principal: "Bearer alice"}, {id: id, principal: "Bearer bob"}}
		empty := rng.IntN(8) == 0 // a POST without a body (see TestGatewayNeverSendsAKeyedRequestTwice)
		for _, k := range ks {
			k.payload = "amount=" + strconv.Itoa(len(keys))
			if empty {
				k.payload = ""
			}
			if rng.IntN(10) == 0 {
				k.rogue = k.payload + "&again=1"
			}
		}
		ks[1].payload = ks[0].payload
		keys = append(keys, ks...)
		return ks
	}

	deadline := time.Now().Add(gatewayCampaignDuration())
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c+2)))
			for time.Now().Before(deadline) {
				for _, k := range newKey(rng) {
					g.pursue(rng, k, deadline)
				}
			}
		}()
	}

	// The faults: kills and freezes while the store is cut or stalled too
	// (one outage at a time, in the background).
	frng := rand.New(rand.NewPCG(seed, 0))
	var kills, freezes, cuts, stalls int
	if cfg.proxy != nil {
		g.outages = testenv.NewOutages(cfg.proxy)
	}
	for time.Now().Add(300 * time.Millisecond).Before(deadline) {
		time.Sleep(time.Duration(100+frng.IntN(300)) * time.Millisecond)
		switch f := frng.IntN(10); {
		case f < 3:
			g.procs.KillOne(frng)
			kills++
		case f < 6:
			g.procs.FreezeOne(frng, time.Duration(300+frng.IntN(3000))*time.Millisecond)
			freezes++
		case g.outages == nil || g.outages.Busy():
		case f < 8:
			d := time.Duration(100+frng.IntN(400)) * time.Millisecond
			if frng.IntN(4) == 0 {
				d = gatewayLease + 500*time.Millisecond
			}
			g.outages.Cut(d)
			cuts++
		default:
			g.outages.Stall(time.Duration(100+frng.IntN(2500)) * time.Millisecond)
			stalls++
		}
	}
	if g.outages != nil {
		g.outages.Wait()
	}
	wg.Wait()
	g.procs.ThawAll()
	up.behave.Store(true)
	up.mu.Lock()
	t.Logf("%d keys, %d requests, %d executions; %d kills, %d freezes, %d cuts, %d stalls",
		len(keys), len(g.attempts), len(up.execs), kills, freezes, cuts, stalls)
	up.mu.Unlock()

	// The faults are over: every key must get its stored answer, replayed;
	// the gateways are given as long as keys get theirs.
	stored := map[*campaignKey]*attempt{}
	last := map[*campaignKey]*attempt{}
	rng := rand.New(rand.NewPCG(seed, 99))
	pending := slices.Clone(keys)
	res := drain.Wait(drain.Config{Stall: 30 * time.Second, Bound: drain.Bound(gatewayCampaignDuration()), Poll: 50 * time.Millisecond, Logf: t.Logf},
		func() (drain.Progress, error) {
			// One pass over the keys still without an answer, two seconds at most.
			end := time.Now().Add(2 * time.Second)
			for i := 0; i < len(pending) && time.Now().Before(end); {
				k := pending[i]
				a := g.send(rng, k, k.payload, 5*time.Second)
				if a.final() && a.status == http.StatusUnprocessableEntity && k.rogue != "" {
					a = g.send(rng, k, k.rogue, 5*time.Second)
				}
				if a.final() && a.replayed {
					stored[k] = a
					pending = slices.Delete(pending, i, i+1)
					continue
				}
				last[k] = a
				i++
			}
			return drain.Progress{Done: len(stored), Left: len(pending)}, nil
		})
	if !res.Drained {
		t.Errorf("VIOLATION: %d keys without a stored answer replayed after the faults: %s; the drain's curve (answered/not every 10s): %s", len(pending), res.Why, res.CurveString(10*time.Second))
		for _, k := range pending[:min(20, len(pending))] {
			if a := last[k]; a != nil {
				t.Errorf("VIOLATION: key %s of %s: no stored answer replayed (last: %d %s %q)", k.id, k.principal, a.status, a.problem, a.body)
			}
		}
	}
	g.procs.StopAll()
	up.inflight.Wait()
	// A gateway frozen while it holds a shared SQLite file's lock is an
	// outage for all of them.
	g.check(keys, stored, cfg.proxy == nil)
	if t.Failed() {
		t.Logf("replay: go test ./cmd/idem -run '^%s$' -gateway.campaign.seed=%d -gateway.campaign.duration=%v", cfg.TestName, seed, gatewayCampaignDuration())
	}
}

// pursue sends k's request until it gets a final answer (or the campaign
// ends): with random client timeouts, now and then a duplicate at once or
// a request with another body, and sometimes once more after the answer.
func (g *gatewayCampaignRun) pursue(rng *rand.Rand, k *campaignKey, deadline time.Time) {
	var dup sync.WaitGroup
	defer dup.Wait()
	if k.rogue != "" && rng.IntN(2) == 0 {
		g.send(rng, k, k.rogue, time.Second)
	}
	for time.Now().Before(deadline) {
		timeout := time.Duration(300+rng.IntN(3700)) * time.Millisecond
		if rng.IntN(5) == 0 {
			dup.Add(1)
			drng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			go func() {
				defer dup.Done()
				g.send(drng, k, k.payload, timeout)
			}()
		}
		a := g.send(rng, k, k.payload, timeout)
		if a.final() {
			if rng.IntN(3) == 0 {
				g.send(rng, k, k.payload, timeout)
			}
			if k.rogue != "" && rng.IntN(2) == 0 {
				g.send(rng, k, k.rogue, time.Second)
			}
			return
		}
		time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond)
	}
}

func (g *gatewayCampaignRun) check(keys []*campaignKey, stored map[*campaignKey]*attempt, sharedFile bool) {
	t := g.t
	violations := 0
	fail := func(format string, args ...any) {
		violations++
		if violations <= 20 {
			t.Errorf("VIOLATION: "+format, args...)
		}
	}
	stale, broken := 0, 0
	byReq := map[string]*attempt{}
	for _, a := range g.attempts {
		byReq[a.reqID] = a
	}
	execsOf := map[*campaignKey][]*execution{}
	byID := map[int]*execution{}
	forwarded := map[string]*execution{}
	keyOf := map[[2]string]*campaignKey{}
	for _, k := range keys {
		keyOf[[2]string{k.id, k.principal}] = k
	}
	for _, e := range g.up.execs {
		byID[e.id] = e
		a := byReq[e.reqID]
		switch {
		case a == nil:
			fail("execution %d carries request id %q, which no client sent", e.id, e.reqID)
			continue
		case forwarded[e.reqID] != nil:
			fail("request %s reached the upstream twice (executions %d and %d)", e.reqID, forwarded[e.reqID].id, e.id)
		case e.broken:
			// Its gateway died or cancelled the call (its lease ran out)
			// while sending it: nothing the upstream can act on.
			forwarded[e.reqID] = e
			broken++
			continue // no request, no effect
		case e.key != strconv.Quote(a.key.id) || e.principal != a.key.principal || e.payload != a.payload:
			fail("execution %d of request %s carries key %s, %q, %q; the client sent %q, %q, %q", e.id, e.reqID,
				e.key, e.principal, e.payload, a.key.id, a.key.principal, a.payload)
		}
		if e.fence == 0 {
			fail("execution %d (request %s) came without a fence", e.id, e.reqID)
		}
		if e.stale {
			stale++
		}
		forwarded[e.reqID] = e
		execsOf[a.key] = append(execsOf[a.key], e)
	}

	// Every answer.
	replayedExec := map[*campaignKey]int{}
	for _, a := range g.attempts {
		if a.got == 0 {
			continue
		}
		e := forwarded[a.reqID]
		switch {
		case a.replayed:
			s := byID[a.exec]
			switch {
			case e != nil:
				fail("request %s was answered with a replay, but was forwarded (execution %d)", a.reqID, e.id)
			case s == nil:
				fail("request %s (key %s of %s) was replayed execution %d, which never ran", a.reqID, a.key.id, a.key.principal, a.exec)
			case keyOf[[2]string{strings.Trim(s.key, `"`), s.principal}] != a.key || s.payload != a.payload:
				fail("request %s (key %s of %s, %q) was replayed execution %d of key %s of %s, %q", a.reqID, a.key.id, a.key.principal,
					a.payload, s.id, s.key, s.principal, s.payload)
			case !s.complete() || s.status != a.status || s.body != a.body:
				fail("request %s was replayed %d %q; execution %d answered %d %q (cancelled %v)", a.reqID, a.status, a.body, s.id, s.status, s.body, s.cancelled)
			}
			if prev, ok := replayedExec[a.key]; ok && prev != a.exec {
				fail("key %s of %s was replayed executions %d and %d", a.key.id, a.key.principal, prev, a.exec)
			}
			replayedExec[a.key] = a.exec
		case a.problem != "":
			if e != nil {
				fail("request %s was answered %d %s by gateway %d, but was forwarded (execution %s)", a.reqID, a.status, a.problem, a.gateway, g.describe(e))
			}
			if a.problem == "mismatch" && !g.otherBodyBefore(a) {
				fail("request %s (key %s of %s) was answered 422, though no request with another body came before it", a.reqID, a.key.id, a.key.principal)
			}
		case a.exec != 0:
			if e == nil || e.id != a.exec {
				fail("request %s was answered execution %d's response as its own, but its execution is %v", a.reqID, a.exec, e)
			} else if a.status != e.status || a.body != e.body {
				fail("request %s was answered %d %q; its execution %d answered %d %q", a.reqID, a.status, a.body, e.id, e.status, e.body)
			}
		}
	}

	// Every key.
	for _, k := range keys {
		s := stored[k]
		es := execsOf[k]
		for i, e1 := range es {
			for _, e2 := range es[i+1:] {
				// A gateway frozen between its claim and its call (before
				// e1 started) sends it when thawed, its lease gone.
				if e2.start < e1.end && !e1.stale && !e2.stale && !g.procs.LostDuring(e1.proc, e1.start, e2.start) &&
					!g.procs.FrozenDuring(e1.proc, e1.start-int64(10*time.Second), e1.start) {
					fail("key %s of %s: executions %s and %s overlapped by %v, with neither killed nor frozen (outages: %s)",
						k.id, k.principal, g.describe(e1), g.describe(e2), time.Duration(e1.end-e2.start), g.outagesNear(e1.start, e2.end))
				}
			}
		}
		if s == nil {
			continue
		}
		if prev, ok := replayedExec[k]; ok && prev != s.exec {
			fail("key %s of %s: replayed execution %d during the faults, %d after", k.id, k.principal, prev, s.exec)
		}
		se := byID[s.exec]
		if se == nil {
			continue // reported above
		}
		for _, e := range es {
			switch {
			case e == se:
			case e.stale:
			case e.start > se.start:
				fail("key %s of %s: execution %s started %v after execution %s, whose answer is stored (fences %d, %d)",
					k.id, k.principal, g.describe(e), time.Duration(e.start-se.start), g.describe(se), e.fence, se.fence)
			case e.complete() && !g.procs.LostDuring(e.proc, e.start, se.start) && !(e.proc%2 == 1 && g.outageDuring(e.start, se.start)) &&
				!(sharedFile && g.procs.AnyFrozenDuring(e.start, se.start)):
				fail("key %s of %s: execution %d (gateway %d) answered %d and was not stored, with no kill, freeze or outage before execution %d (gateway %d) ran it again %v later",
					k.id, k.principal, e.id, e.proc, e.status, se.id, se.proc, time.Duration(se.start-e.end))
			}
		}
	}
	t.Logf("%d executions refused by the upstream for a stale fence, %d requests cut short by their gateway", stale, broken)
	if violations > 20 {
		t.Errorf("… %d violations in all", violations)
	}
}

// describe says what an execution did, its times relative to the
// campaign's start.
func (g *gatewayCampaignRun) describe(e *execution) string {
	what := strconv.Itoa(e.status)
	switch {
	case e.stale:
		what = "stale"
	case e.cancelled:
		what = "cancelled"
	case e.dropped:
		what = "dropped"
	}
	return fmt.Sprintf("%d (gateway %d, %v–%v, %s)", e.id, e.proc, g.since(e.start), g.since(e.end), what)
}

func (g *gatewayCampaignRun) since(ns int64) time.Duration {
	return time.Duration(ns - g.began).Round(time.Millisecond)
}

// outagesNear lists the cuts and stalls that overlapped [from, to].
func (g *gatewayCampaignRun) outagesNear(from, to int64) string {
	if g.outages == nil {
		return ""
	}
	var s []string
	for _, o := range g.outages.During(from, to) {
		s = append(s, fmt.Sprintf("%s %v–%v", o.Kind, g.since(o.From), g.since(o.To)))
	}
	return strings.Join(s, ", ")
}

// outageDuring reports whether the proxy was cut or stalled at some moment
// of [from, to].
func (g *gatewayCampaignRun) outageDuring(from, to int64) bool {
	return g.outages != nil && len(g.outages.During(from, to)) > 0
}

// otherBodyBefore reports whether a request with another body under a's
// key was sent before a's answer came.
func (g *gatewayCampaignRun) otherBodyBefore(a *attempt) bool {
	for _, b := range g.attempts {
		if b.key == a.key && b.payload != a.payload && b.sent < a.got {
			return true
		}
	}
	return false
}

// gatewayCampaignDuration is how long the campaign runs: -gateway.campaign.duration, or under -short at
// most fleet.ShortDuration.
func gatewayCampaignDuration() time.Duration {
	return fleet.Duration("gateway.campaign.duration", *gatewayCampaignDurationFlag)
}
