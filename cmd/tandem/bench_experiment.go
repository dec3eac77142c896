package main

import "errors"

func runBenchExperiment(args []string) error { return errors.New("not yet") }
