package otelidem

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TracerProviderFromEnv returns a tracer provider that exports spans over
// OTLP when OpenTelemetry's standard environment asks for it, and nil
// otherwise:
//
//	OTEL_TRACES_EXPORTER                      unset or "otlp" (anything else, "none" included: nil)
//	OTEL_EXPORTER_OTLP_ENDPOINT               where to send (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); unset: nil
//	OTEL_EXPORTER_OTLP_PROTOCOL               "http/protobuf" (the default) or "grpc" (or …_TRACES_PROTOCOL)
//	OTEL_EXPORTER_OTLP_HEADERS, …_TIMEOUT, …  read by the exporter
//	OTEL_TRACES_SAMPLER, OTEL_BSP_*           read by the SDK
//	OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES  the resource (service.name defaults to service)
//
// Spans are batched; call Shutdown on the provider before exiting to send
// the last ones.
func TracerProviderFromEnv(ctx context.Context, service string) (*sdktrace.TracerProvider, error) {
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return nil, nil
	}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	var err error
	switch strings.TrimSpace(protocol) {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("otelidem: OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("otelidem: the OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost())
	if err != nil {
		return nil, fmt.Errorf("otelidem: the resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}
