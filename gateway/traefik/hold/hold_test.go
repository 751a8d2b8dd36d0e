package hold

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// backend answers as Traefik does for a Service without a ready pod (503, no Retry-After) until
// `ready` attempts have passed, then echoes the body it got.
func backend(ready int32, attempts *int32) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if atomic.AddInt32(attempts, 1) <= ready {
			http.Error(rw, "no available server", http.StatusServiceUnavailable)
			return
		}
		body, _ := io.ReadAll(req.Body)
		rw.Header().Set("X-Served", "yes")
		rw.WriteHeader(http.StatusOK)
		rw.Write(body)
	})
}

func serve(t *testing.T, next http.Handler, config *Config) *httptest.ResponseRecorder {
	t.Helper()
	h, err := New(context.Background(), next, config, "hold")
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m"}`)))
	return rec
}

func TestAHeldRequestIsServedWithItsBodyOnceAPodIsReady(t *testing.T) {
	var attempts int32
	rec := serve(t, backend(2, &attempts), &Config{HoldSeconds: 10, RetryAfterSeconds: 5, MaxBodyBytes: 1024})
	if rec.Code != http.StatusOK || rec.Body.String() != `{"model":"m"}` || rec.Header().Get("X-Served") != "yes" {
		t.Fatalf("got %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	if attempts != 3 {
		t.Fatalf("%d attempts, want 3", attempts)
	}
}

func TestAfterTheHoldItAnswers503WithRetryAfter(t *testing.T) {
	var attempts int32
	rec := serve(t, backend(1000, &attempts), &Config{HoldSeconds: 2, RetryAfterSeconds: 7, MaxBodyBytes: 1024})
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "7" {
		t.Fatalf("got %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if !strings.Contains(rec.Body.String(), `"code":"scaled_to_zero"`) || attempts < 2 {
		t.Fatalf("body %q after %d attempts", rec.Body.String(), attempts)
	}
}

func TestTheRuntimesOwn503PassesThrough(t *testing.T) {
	var attempts int32
	loading := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		atomic.AddInt32(&attempts, 1)
		rw.Header().Set("Retry-After", "5")
		rw.WriteHeader(http.StatusServiceUnavailable)
		rw.Write([]byte("loading"))
	})
	rec := serve(t, loading, &Config{HoldSeconds: 10, RetryAfterSeconds: 1, MaxBodyBytes: 1024})
	if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != "loading" || attempts != 1 {
		t.Fatalf("got %d %q after %d attempts", rec.Code, rec.Body.String(), attempts)
	}
}

func TestABodyTooLargeToHoldIsSentOnceWhole(t *testing.T) {
	var attempts int32
	rec := serve(t, backend(0, &attempts), &Config{HoldSeconds: 10, RetryAfterSeconds: 1, MaxBodyBytes: 4})
	if rec.Code != http.StatusOK || rec.Body.String() != `{"model":"m"}` || attempts != 1 {
		t.Fatalf("got %d %q after %d attempts", rec.Code, rec.Body.String(), attempts)
	}
}
