// Package ext is Traefik's extension point for its dynamic configuration types: a nested module of
// the Traefik repository that the v3 module zip leaves out and the module proxy does not serve.
// Traefik's open-source build uses it exactly as here, two empty structs.
package ext

// HTTP is a dynamic.HTTP extension.
type HTTP struct{}

// Router is a dynamic.Router extension.
type Router struct{}
