module pagoda.local/e2e/controlplane/keda

go 1.26.0

require github.com/kedacore/keda/v2 v2.21.0

// KEDA's own go.mod directives (a dependency's replace/exclude lines do not apply to a module that
// requires it).
replace github.com/nexus-rpc/nexus-proto-annotations v0.1.0 => github.com/nexus-rpc/nexus-proto-annotations v0.1.1-0.20260629224316-835bd8d49cb4

exclude github.com/go-chi/chi/v5 v5.2.3
