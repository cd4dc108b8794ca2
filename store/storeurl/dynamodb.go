package storeurl

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/dynamostore"
)

// DynamoDB URLs name the table, dynamodb://TABLE; the region, credentials
// and endpoint come from the standard AWS configuration
// (config.LoadDefaultConfig: AWS_REGION, AWS_PROFILE, the instance's role;
// AWS_ENDPOINT_URL_DYNAMODB for DynamoDB Local or an emulator). Open
// creates the table unless Options.SkipMigrate.
func init() {
	openers[DynamoDB] = func(ctx context.Context, spec Spec, o Options) (store.Store, error) {
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("idem: store URL %q: the AWS configuration: %w", spec.Raw, err)
		}
		s, err := dynamostore.New(dynamostore.Config{Client: dynamodb.NewFromConfig(cfg), Table: spec.Path, Limits: o.Limits})
		if err != nil {
			return nil, err
		}
		if !o.SkipMigrate {
			if err := s.Migrate(ctx); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
}
