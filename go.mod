module github.com/causeway-mesh/causeway

go 1.26.0

require (
	github.com/spiffe/go-spiffe/v2 v2.9.0
	go.uber.org/zap v1.28.0
	google.golang.org/protobuf v1.36.12
)

require (
	go.uber.org/multierr v1.10.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
)
