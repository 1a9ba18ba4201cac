package main

import (
	"fmt"
	"strings"
)

// kvbench's scenario tenants. The ceiling, tail, overload and load
// scenarios measure the cluster, not a tenant's contract, so their
// tenants have none; their priorities are what the overload scenario is
// about. They sit beside the workload's tenants (1..--tenants), kvbench's
// monitor (--tenants+1) and the resp path's tenant (--tenants+2).
const (
	loadTenantName      = "kvbench-load"                  // the load tenant's name: its series' tenant label
	loadTenantToken     = "kvbench-load-token"            // standard: ceiling, tail and load writers
	floodTenantToken    = "kvbench-flood-token"           // bulk: the overload scenario's flood
	victimCritTenantTok = "kvbench-victim-critical-token" // critical: an overload victim
	victimStdTenantTok  = "kvbench-victim-standard-token" // standard: an overload victim
	// benchTenantIDOffset: the first scenario tenant's id is --tenants
	// plus this.
	benchTenantIDOffset = 3

	// benchAdminToken guards every embedded node's admin endpoint
	// (admin_listen), which kvbench scrapes for /metrics.
	benchAdminToken = "kvbench-admin-token-7f3a9c1e5b"
	// adminPortOffset: node i's admin_listen is --base-port + this + i.
	adminPortOffset = 60
)

// benchTenant is one scenario tenant of the generated config.
type benchTenant struct {
	name, token, priority string
}

var benchTenants = [...]benchTenant{
	{loadTenantName, loadTenantToken, "standard"},
	{"kvbench-flood", floodTenantToken, "bulk"},
	{"kvbench-victim-critical", victimCritTenantTok, "critical"},
	{"kvbench-victim-standard", victimStdTenantTok, "standard"},
}

// benchTenantsConfig renders the scenario tenants' [[tenants]] tables.
func benchTenantsConfig(o *Options) string {
	var b strings.Builder
	for k, t := range benchTenants {
		fmt.Fprintf(&b, "\n[[tenants]]\nid = %d\nname = %q\ntoken = %q\npriority = %q\n",
			o.Tenants+benchTenantIDOffset+k, t.name, t.token, t.priority)
	}
	return b.String()
}

// tokenFor returns the token a scenario tenant uses on c: its own on an
// embedded cluster, the one given token on an existing cluster (whose
// tenants kvbench does not know).
func (c *cluster) tokenFor(tok string) string {
	if c.benchToken != "" {
		return c.benchToken
	}
	return tok
}
