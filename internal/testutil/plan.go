package testutil

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"
)

// Plan is what tests check of a proxy's plan answer (GET proxy.PlanPath):
// whether its planner moves engines between the pools, and the engines of
// each pool.
type Plan struct {
	Acting  bool     `json:"acting"`
	Prefill []string `json:"prefill"`
	Decode  []string `json:"decode"`
}

// GetPlan reads the plan answer at url, a proxy's address with
// proxy.PlanPath (testutil does not import the proxy). It returns the
// answer's HTTP status and the plan decoded from its body, with the decode
// error; a proxy without a planner answers 404, and no plan. It fails the
// test when the request cannot be sent or is not answered within 10 s.
func GetPlan(t testing.TB, url string) (status int, plan Plan, err error) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&plan)
	return resp.StatusCode, plan, err
}
