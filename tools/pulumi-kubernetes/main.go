// Command pulumi-resource-kubernetes serves Pulumi's Kubernetes provider from the Go module
// github.com/pulumi/pulumi-kubernetes/provider/v4. Upstream's own main embeds files that its
// `go generate` step writes into the source tree, which a module build cannot run; tools/build.sh
// copies the module's own schema.json and terraform-mapping.json beside this file instead, and this
// main does what that step does: it stamps the provider's version into the schema.
package main

import (
	_ "embed"
	"encoding/json"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema.json
var schema []byte

//go:embed terraform-mapping.json
var terraformMapping []byte

func main() {
	var spec map[string]any
	if err := json.Unmarshal(schema, &spec); err != nil {
		panic(err)
	}
	spec["version"] = version.Version
	versioned, err := json.Marshal(spec)
	if err != nil {
		panic(err)
	}
	provider.Serve("kubernetes", version.Version, versioned, terraformMapping)
}
