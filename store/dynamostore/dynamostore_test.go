package dynamostore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/dynamostore"
	"github.com/idemgo/idem/store/storetest"
)

// newTable returns the name of a table of its own, made by Migrate and
// deleted when t ends.
func newTable(t testing.TB) *string {
	c := testenv.DynamoDBClient(t)
	table := testenv.RandomName("idem_records_")
	s, err := dynamostore.New(dynamostore.Config{Client: c, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return aws.String(table)
}

// newStore returns a store on a table of its own (see newTable).
func newStore(t testing.TB, clock idem.Clock) store.Store {
	s, err := dynamostore.New(dynamostore.Config{Client: testenv.DynamoDBClient(t), Table: *newTable(t), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConformance runs the suite on the store's injected clock: the lease
// and retention cases advance it instead of sleeping.
func TestConformance(t *testing.T) {
	storetest.RunClocked(t, storetest.Capabilities{Persistent: true, Unclaims: true, FencedDeletes: true}, newStore)
}

// openAt opens the store at location, "TABLE ENDPOINT": a client of the
// endpoint (the campaign's proxy, or dynalite itself), the table migrated
// by the test's own process.
func openAt(t testing.TB, location string) store.Store {
	table, endpoint, _ := strings.Cut(location, " ")
	cfg, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	})
	s, err := dynamostore.New(dynamostore.Config{Client: c, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if !storetest.IsChild() { // the test's own process made the table; a worker may start in an outage
		testenv.Eventually(t, 10*time.Second, "migrate the table", func() error { return s.Migrate(context.Background()) })
	}
	return s
}

func TestMultiProcess(t *testing.T) {
	storetest.MultiProcess(t, "TestMultiProcess", testenv.RandomName("idem_mp_")+" "+testenv.DynamoDB(t), 4, 200, openAt)
}

func TestCrashTakeover(t *testing.T) {
	storetest.CrashTakeover(t, "TestCrashTakeover", testenv.RandomName("idem_crash_")+" "+testenv.DynamoDB(t), openAt)
}

// TestCampaign runs the fault campaign on dynalite, every process reaching
// it through a TCP proxy that the campaign cuts and stalls now and then; a
// dynalite of the test's own, which the campaign also kills with SIGKILL
// and starts again on its files (the shared one under -short or where
// IDEM_DYNAMODB_ENDPOINT is set).
func TestCampaign(t *testing.T) { storetest.Campaign(t, campaignConfig(t, "TestCampaign")) }

// TestGuardCampaign runs guarded work (idem.Guard) under the same faults.
func TestGuardCampaign(t *testing.T) {
	storetest.GuardCampaign(t, campaignConfig(t, "TestGuardCampaign"))
}

func campaignConfig(t *testing.T, name string) storetest.CampaignConfig {
	cfg := storetest.CampaignConfig{TestName: name, Processes: 2, Open: openAt}
	if !storetest.IsChild() {
		endpoint := testenv.DynamoDB(t)
		if testenv.OwnDynalite() {
			srv := testenv.StartDynalite(t)
			endpoint = srv.Endpoint
			cfg.Crash = func() {
				if err := srv.Restart(); err != nil {
					t.Error(err)
				}
			}
		}
		u, err := url.Parse(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		p := testenv.StartProxy(t, u.Host)
		cfg.Cut, cfg.Restore, cfg.Stall, cfg.Unstall = p.Cut, p.Restore, p.Stall, p.Unstall
		table := testenv.RandomName("idem_campaign_")
		cfg.Location, cfg.Direct = table+" http://"+p.Addr(), table+" "+endpoint
	}
	return cfg
}

// TestThrottlingIsUnavailable: throttling and a request that timed out are
// store.ErrUnavailable (nothing runs; the caller retries), never a wrong
// answer; a validation error is not.
func TestThrottlingIsUnavailable(t *testing.T) {
	for _, tt := range []struct {
		err         error
		unavailable bool
	}{
		{&smithy.GenericAPIError{Code: "ProvisionedThroughputExceededException", Fault: smithy.FaultClient}, true},
		{&smithy.GenericAPIError{Code: "ThrottlingException", Fault: smithy.FaultClient}, true},
		{&smithy.GenericAPIError{Code: "InternalServerError", Fault: smithy.FaultServer}, true},
		{context.DeadlineExceeded, true},
		{&smithy.GenericAPIError{Code: "ValidationException", Fault: smithy.FaultClient}, false},
	} {
		if got := errors.Is(dynamostore.Wrap("acquire", tt.err), store.ErrUnavailable); got != tt.unavailable {
			t.Errorf("%v: unavailable %v, want %v", tt.err, got, tt.unavailable)
		}
	}
}
