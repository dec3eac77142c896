package main

func runGenerate(args []string) error { return errNotYet }
