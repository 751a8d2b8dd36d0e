module pagoda.local/e2e/controlplane/traefik

go 1.26.0

require github.com/traefik/traefik/v3 v3.7.13

// Traefik's own go.mod directives (a dependency's replace/exclude lines do not apply to a module
// that requires it): its dynamic-config extension module, its mux fork, the excluded SDK version.
replace github.com/traefik/traefik/dynamic/ext => ./ext

replace github.com/gorilla/mux => github.com/containous/mux v0.0.0-20250523120546-41b6ec3aed59

exclude github.com/tencentcloud/tencentcloud-sdk-go v3.0.83+incompatible

// Filled in by build.sh from the module cache (the module proxy serves neither the Containous fork
// of go-http-auth nor the SDKs of some of lego's ACME DNS providers): upstream go-http-auth v0.4.0
// with the two functions Traefik uses of the fork (go-http-auth/containous_fork.go), and lego
// without those DNS providers.
replace (
	github.com/abbot/go-http-auth => ./go-http-auth
	github.com/go-acme/lego/v5 => ./lego
)

// The Gateway API CRDs installed in tests come from this version of the module.
require sigs.k8s.io/gateway-api v1.6.3
