package main

func runModel(args []string) error { return errNotYet }
