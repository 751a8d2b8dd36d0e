// Package hold is a Traefik middleware for model variants that scale to zero.
//
// While a backend Service has no ready pod, Traefik answers 503 without a Retry-After header. This
// middleware holds such a request and sends it again every second, for up to holdSeconds, so that
// a variant that becomes ready meanwhile serves it; a request still unserved then gets 503 with
// Retry-After, which OpenAI clients retry, instead of a connection error. Traefik's router metrics
// count the request when it is answered: that count is the demand that wakes the variant (its KEDA
// ScaledObject), so the hold is short and Retry-After long. A 503 that carries Retry-After is the
// runtime's own (loading, draining) and passes through unchanged, as does every other response.
package hold

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Config is the middleware's configuration.
type Config struct {
	HoldSeconds       int   `json:"holdSeconds,omitempty"`
	RetryAfterSeconds int   `json:"retryAfterSeconds,omitempty"`
	MaxBodyBytes      int64 `json:"maxBodyBytes,omitempty"`
}

// CreateConfig returns the defaults: hold 15 s, then Retry-After 30 s, which covers about 105 s of
// wake-up for a client with the OpenAI library's two retries; bodies up to 16 MiB are held.
func CreateConfig() *Config {
	return &Config{HoldSeconds: 15, RetryAfterSeconds: 30, MaxBodyBytes: 16 << 20}
}

// Hold holds requests while their backend has no ready pod.
type Hold struct {
	next       http.Handler
	hold       time.Duration
	retryAfter int
	maxBody    int64
}

// New builds the middleware.
func New(_ context.Context, next http.Handler, config *Config, _ string) (http.Handler, error) {
	if config.HoldSeconds < 0 || config.RetryAfterSeconds < 1 || config.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("hold: holdSeconds must be at least 0, retryAfterSeconds at least 1, maxBodyBytes at least 0")
	}
	return &Hold{
		next:       next,
		hold:       time.Duration(config.HoldSeconds) * time.Second,
		retryAfter: config.RetryAfterSeconds,
		maxBody:    config.MaxBodyBytes,
	}, nil
}

func (h *Hold) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, h.maxBody+1))
	if err != nil {
		http.Error(rw, "reading the request body failed", http.StatusBadRequest)
		return
	}
	if int64(len(body)) > h.maxBody {
		// Too large to send twice: once, as it came.
		req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), req.Body))
		h.next.ServeHTTP(rw, req)
		return
	}
	deadline := time.Now().Add(h.hold)
	for {
		req.Body = io.NopCloser(bytes.NewReader(body))
		attempt := &attempt{rw: rw, header: http.Header{}}
		h.next.ServeHTTP(attempt, req)
		if !attempt.unavailable {
			return
		}
		if time.Now().Add(time.Second).After(deadline) {
			break
		}
		select {
		case <-req.Context().Done():
			return
		case <-time.After(time.Second):
		}
	}
	rw.Header().Set("Retry-After", strconv.Itoa(h.retryAfter))
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintf(rw, `{"error":{"message":"No replica of this model is ready yet; it is starting. Retry after %d s.","type":"service_unavailable","param":null,"code":"scaled_to_zero"}}`, h.retryAfter)
}

// attempt passes a response through unless it is a 503 without Retry-After, which it swallows.
type attempt struct {
	rw          http.ResponseWriter
	header      http.Header
	decided     bool
	unavailable bool
}

func (a *attempt) Header() http.Header {
	if a.decided && !a.unavailable {
		return a.rw.Header()
	}
	return a.header
}

func (a *attempt) WriteHeader(code int) {
	if a.decided {
		return
	}
	a.decided = true
	if code == http.StatusServiceUnavailable && a.header.Get("Retry-After") == "" {
		a.unavailable = true
		return
	}
	for key, values := range a.header {
		a.rw.Header()[key] = values
	}
	a.rw.WriteHeader(code)
}

func (a *attempt) Write(b []byte) (int, error) {
	if !a.decided {
		a.WriteHeader(http.StatusOK)
	}
	if a.unavailable {
		return len(b), nil
	}
	return a.rw.Write(b)
}

// Flush keeps streamed responses (server-sent events) streaming.
func (a *attempt) Flush() {
	if a.decided && !a.unavailable {
		if flusher, ok := a.rw.(http.Flusher); ok {
			flusher.Flush()
		}
	}
}
