// kstatus-check prints what kstatus (the status library of Flux and kpt) computes for each object it
// reads: one JSON object per input line, {"status": ..., "message": ...} per output line.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(in.Bytes()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		result, err := status.Compute(obj)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if err := out.Encode(map[string]string{"status": result.Status.String(), "message": result.Message}); err != nil {
			os.Exit(2)
		}
	}
}
