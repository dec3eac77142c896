// Package testutil holds the helpers that tests across Tandem share instead
// of copying: WaitFor (poll a condition under a deadline), FakeClock (a
// settable clock.Clock), StoriesGolden (the greedy golden output of the
// stories260K test model), PyZMQ (a Python with the real libzmq), Missing
// (skip, or fail under TANDEM_REQUIRE_TESTDATA=1), FreePort, FreePorts,
// StartLogged and WaitStarted for the real servers tests run, Metric (one
// sample of a /metrics page), GetPlan (a proxy's pools as its plan route
// lists them), SyncBuffer (a log destination several
// goroutines write) and MemNet (an in-memory network for synctest bubbles).
//
// It imports only the standard library and package testmodels, so that the
// tests of any package, the model and the tensor kernels included, can use
// it without an import cycle. The loaded stories260K model, which needs
// packages model and tokenizer, is in the subpackage loaded.
package testutil
